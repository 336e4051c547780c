"""Accelerate's side of accel, at the edge: its argument, environment and config-file translation into
accel's typed settings, its remaining names and helpers, and the table of what accel lacks. The engine
folders never import this package; the public modules (`accel.accelerator`, `accel.utils`, ...) do."""
