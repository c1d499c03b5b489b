"""Predictions: models of cost that say what a measurement should find before it is made.

``roofline`` (the latency model: bytes and FLOPs per step, the device probe's figures, its calibration) and
``predictions`` (the roofline applied: suite plans, predictions beside measurements, residuals). Above the
run machinery (a plan reads suites and point ids) and serving, below reports and experiments.
"""
