"""What a job of the study is: its validated config, its identity (hash, tags, environment), the ranking's keys and the peers it can run beside."""
