"""Benchmarks: ``python -m bench [--quick] [names...]`` (or ``make bench``).

Every figure is reported beside a baseline measured in the same run, as a ratio, because
these machines are noisy. Results go to ``bench/results/latest.{md,json}``.
"""
