"""The product's benchmarks: each a module run as ``python -m benchmarks.<name>``, printing its figures and writing them
as JSON (``--out``; ``--table`` reprints an earlier run's), on the harness they share (:mod:`benchmarks._harness`).

Building (``build``, ``spark_build``), looking up (``lookup``, ``load``), drafting (``service_step``,
``proposer_step``),
serving in vLLM (``vllm_serving``), the peers by replay and in a fleet (``peers``, ``fleet``), the live layer
(``live_layer``) and the replicas' memory (``replica_memory``). ``docs/benchmarks.md`` lists each with its command and
``docs/results.md`` the figures they gave.
"""
