"""Slurm, both ways: job state changes from a running Slurm to the jobs topic
(:mod:`stream.slurm.collector`), and gated node drains from the incidents topic
(:mod:`stream.slurm.remediate`)."""
