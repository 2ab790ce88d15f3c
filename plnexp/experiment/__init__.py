"""Running the study: a command line planned into jobs, each job run (runner), sweeps, reruns, resumes and the peers' runs."""
