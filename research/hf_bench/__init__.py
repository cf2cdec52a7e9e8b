"""The HF loop's benchmark (``python -m research.hf_bench bench|replay|budget``): speed-up of any drafter in our own
decoding loop against plain greedy decoding, replay of the papers' drafters by category, and the budget choice on a
measured latency curve. Needs the ``hf`` extra.
"""
