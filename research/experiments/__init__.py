"""One-off experiments whose findings are in ``docs/``: how far the shipped chain is from the best one its union
holds (:mod:`research.experiments.ranking_headroom`), what the target's own state buys its ranking
(:mod:`research.experiments.model_state_headroom`), the cut on a simulated engine
(:mod:`research.experiments.cut_simulation`), the oracle cut inside vLLM (:mod:`research.experiments.oracle_cut`) and
accept length against a distilled corpus's size (:mod:`research.experiments.distill_curve`).
"""
