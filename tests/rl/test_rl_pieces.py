"""The RL run's pure pieces (`rlcp/rl/`): the reward, the advantages, the loss, the answer's spans,
and which tokens count. The run itself, over real vLLM engines: tests/rl/test_rl_run.py."""

from __future__ import annotations

import pytest

from rlcp.rl.loop import RunSettings, Snapshots, Trainer
from rlcp.rl.policy import clipped_pg_loss, group_advantages
from rlcp.rl.sampling import SamplingError, parse_answer, token_versions
from rlcp.rl.task import TargetTokenTask

torch = pytest.importorskip("torch")


def test_the_reward_is_the_share_of_target_tokens_and_prompts_go_round():
    task = TargetTokenTask(prompts=((1,), (2,), (3,)), target=7)
    assert task.reward([7, 1, 7, 2]) == 0.5 and task.reward([]) == 0.0
    assert task.prompts_for(1, 2) == [(1,), (2,)] and task.prompts_for(2, 2) == [(3,), (1,)]


def test_advantages_are_normalised_within_each_group():
    adv = group_advantages([0.0, 1.0, 0.5, 0.5], group=2)
    assert adv[0] == pytest.approx(-1.0, abs=1e-4) and adv[1] == pytest.approx(1.0, abs=1e-4)
    assert adv[2:] == [0.0, 0.0]  # a group of equal rewards teaches nothing


def test_on_policy_the_loss_is_plain_policy_gradient_and_old_tokens_are_weighted_not_clipped():
    lp = torch.tensor([-1.0, -2.0], requires_grad=True)
    clipped_pg_loss([lp], [[-1.0, -2.0]], [0.5]).backward()
    assert lp.grad.tolist() == pytest.approx([-0.25, -0.25])  # -A / tokens, ratio 1
    # Sampled by older weights that gave the tokens less probability: weighted up, capped at 2.
    lp2 = torch.tensor([-1.0, -2.0], requires_grad=True)
    clipped_pg_loss([lp2], [[-1.5, -9.0]], [0.5]).backward()
    assert lp2.grad.tolist() == pytest.approx([-0.25 * 1.6487, -0.25 * 2.0], rel=1e-3)
    # A token left out counts for nothing, not even in the mean.
    lp3 = torch.tensor([-1.0, -2.0], requires_grad=True)
    clipped_pg_loss([lp3], [[-1.0, -2.0]], [0.5], keep=[[True, False]]).backward()
    assert lp3.grad.tolist() == pytest.approx([-0.5, 0.0])


def test_spans_give_each_token_its_version_and_headers_fill_in():
    assert token_versions([{"version": "a", "start": 0, "end": 2}, {"version": "b", "start": 2, "end": 3}], 4, "z") == [
        "a",
        "a",
        "b",
        "z",
    ]
    body = {
        "choices": [
            {"index": 1, "token_ids": [5, 6], "logprobs": {"content": [{"logprob": -0.1}, {"logprob": -0.2}]}},
            {
                "index": 0,
                "token_ids": [7],
                "logprobs": {"content": [{"logprob": -0.3}]},
                "weight_versions": [{"version": "v2", "start": 0, "end": 1}],
            },
        ]
    }
    headers = {
        "X-RL-Worker": "w1",
        "X-RL-Weight-Version": "v1",
        "X-RL-Weight-Versions": '[[{"version": "v2", "start": 0, "end": 1}], [{"version": "v3", "start": 1, '
        '"end": 2}]]',
    }
    first, second = parse_answer(body, headers, (1, 2), "http://server")
    assert (first.tokens, first.versions, first.worker) == ([7], ["v2"], "w1")
    assert (second.tokens, second.logprobs, second.versions) == ([5, 6], [-0.1, -0.2], ["v1", "v3"])
    with pytest.raises(SamplingError, match="2 tokens with 1 logprobs"):
        parse_answer({"choices": [{"token_ids": [1, 2], "logprobs": {"content": [{"logprob": 0}]}}]}, {}, (1,), "u")


def test_tokens_past_the_staleness_bound_are_dropped_unless_every_tokencounts_in_loss():
    model = torch.nn.Linear(2, 2)
    snaps = Snapshots(keep=2)
    for v in ("base", "step-1", "step-2"):
        snaps.add(v, model)
    assert list(snaps.weights) == ["step-1", "step-2"] and snaps.behind("base") == 2 and snaps.behind("x") is None

    def counts(**settings):
        trainer = object.__new__(Trainer)  # the rule alone: no model, fleet or optimizer
        trainer.snapshots, trainer.settings = snaps, RunSettings(**settings)
        return [trainer.counts_in_loss(v) for v in ("step-2", "step-1", "base", "default", None)]

    # "default": weights the trainer never pushed (an engine restarted on its start-up weights).
    assert counts(mode="sync") == [True, False, False, False, True]
    assert counts(mode="async", staleness=1) == [True, True, False, False, True]
    assert counts(mode="sync", drop_stale=False) == [True, True, True, True, True]
