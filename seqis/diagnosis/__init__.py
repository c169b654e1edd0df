"""Reading a batch's mismatch: estimator-free statistics (`statistics`), its cause named as a test (`causes`), what
each detector can see (`power`), what the batch means for each correction (`advice`), the explorer's summaries and
token tables, and the command line (`cli`).
"""
