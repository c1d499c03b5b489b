"""Predictions: models of cost that say what a measurement should find before it is made.

``roofline`` (the latency model: bytes and FLOPs per step, the device probe's figures, its calibration) and
``predictions`` (the roofline applied: suite plans, predictions beside measurements, residuals), ``twin`` and
``twin_cost`` (the serving twin: the engines' own scheduling code on a virtual clock with a calibrated per-step
cost model), ``profile_step`` (where one decode step's time goes, beside the roofline's bytes-at-bandwidth time). Above the
run machinery (a plan reads suites and point ids) and serving, below reports and experiments.
"""
