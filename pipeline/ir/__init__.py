"""Trajectory IR: DuckDB tables where every event points back to exact raw lines."""
