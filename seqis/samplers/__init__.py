"""Where batches come from when nobody uploads one: synthetic scenarios (`scenarios`), a tiny transformer sampled by a
faulty engine (`tiny_lm`, `faults`), and language models the diagnosis was not tuned on (`generators`).
"""
