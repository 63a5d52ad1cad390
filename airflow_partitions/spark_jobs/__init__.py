"""Spark applications shipped inside the package, so `spark-submit` finds them in any installation.

`refresh_partitions.py` is the application a `spark` connection submits; `SparkRefreshHook` passes its
path to spark-submit. Run as a script its directory becomes `sys.path[0]`, so it holds nothing else.
"""
