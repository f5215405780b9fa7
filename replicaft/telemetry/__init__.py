"""What a training process tells the world: structured events and Prometheus metrics.

``events.py`` writes one JSON object per event per rank (the chaos checker and the benchmarks
read them); ``metrics.py`` derives a process's Prometheus metrics from those events.
"""
