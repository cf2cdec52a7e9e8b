"""Python oracles the tested code is checked against: the native drafting core's stages (``suffix_automaton``,
``output_index``, ``local``, ``treeops``, ``calibration``, ``core``), its payload parser (``codec``), and brute-force
references for ingest (``ingest``)."""
