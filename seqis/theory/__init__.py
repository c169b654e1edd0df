"""Closed forms under valid importance-sampling noise (`formulas`), a correction's closed forms read from its
composition (`closed_forms`), and the simulations of gates and clips as rollouts grow (`acceptance`).
"""
