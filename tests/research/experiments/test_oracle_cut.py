"""The oracle cut (:mod:`research.experiments.oracle_cut`), the bound run beside ours in vLLM: it drafts exactly the
tokens of ours' uncut chains that a greedy verifier accepts, so it steps as those chains do and verifies nothing that is
rejected. Driven as vLLM's model runner drives a proposer (:func:`benchmarks.proposer_step.run`), against the session's
small ShareGPT datastore; the references are stretches of that corpus, so chains draft and are accepted."""

from __future__ import annotations

import pytest


@pytest.mark.vllm
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")  # vLLM's imports
def test_the_oracle_cut_keeps_only_what_the_uncut_chains_have_accepted(chat_datastore, database_url, real_stream):
    from benchmarks.proposer_step import _config, run
    from decoder.model import export_checkpoint
    from research.experiments.oracle_cut import OracleCutProposer
    from serving.vllm_proposer import CrestProposer
    from toolkit.settings import Settings

    stream = real_stream.tolist()
    refs = [(stream[a:a + 48], stream[a + 48:a + 112]) for a in (0, 3000, 6000, 9000)]
    vllm_config = _config(4, str(export_checkpoint()), 49152)
    config = Settings(datastore=chat_datastore, database_url=database_url, adaptive=False, live=False,
                      replicas="off", outputs_mb=0)
    oracle = OracleCutProposer(vllm_config, config, references=refs)
    stranger = OracleCutProposer(vllm_config, config, references=refs[1:])  # the first prompt has no reference
    proposers = [CrestProposer(vllm_config, config), oracle, stranger]
    try:
        uncut, cut, unknown = (run(p, refs[:n], 2) for p, n in zip(proposers, (4, 4, 1)))
    finally:
        for p in proposers:
            p.service.close()
    assert uncut["drafted"] > uncut["drafts_accepted"] > 0  # some drafted tokens were rejected, some accepted
    assert cut["drafted"] == cut["drafts_accepted"] == uncut["drafts_accepted"]  # only, and all, the accepted ones
    assert (cut["row_steps"], cut["accept"]) == (uncut["row_steps"], uncut["accept"])  # the same steps
    assert oracle.tokens_proposed - oracle.trimmed == cut["drafted"]  # trimmed, not dropped or added
    assert unknown["drafted"] == 0 and unknown["row_steps"] > 0  # a prompt without a reference drafts nothing
