"""What a sweep's runs say: tables, figures, headlines, trade-offs, and the comparison of two runs' programs."""
