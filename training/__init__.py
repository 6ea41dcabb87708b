"""Training: sample threads and CPU per query class, estimate the profiles, write the η model."""
