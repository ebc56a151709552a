"""inferlets/agent-swarm on SmolLM2: a writer and a critic, two instances over broadcast/subscribe. What
each heard is exactly what the other said, what it heard is what its context holds, and each of its
replies is greedy decoding of that context from scratch: coordinating changes no token. Whichever
instance starts first, and with another pair on other topics beside them."""

from __future__ import annotations

import json

import pytest
from harness import assert_pools_full, direct_greedy, events_of, messages, refused, run

from oven.control.tokenizer import Tokenizer

PROGRAMS = ["agent-swarm"]
INFERENCE_MODEL = "smollm2-135m-instruct"
LOOP_CONFIG = dict(max_kv_pages_per_instance=32)
TASK = "Describe a lighthouse at night."
ROUNDS, MAX_TOKENS = 2, 16


def agent_args(role: str, swarm: str, *more: str) -> list[str]:
    return [role, TASK, "--swarm", swarm, "--rounds", str(ROUNDS), "--max-tokens", str(MAX_TOKENS), *more]


def test_each_agent_hears_what_the_other_said_and_generates_as_greedy_alone(loop, inference):
    # swarm "a": the critic starts first; swarm "b": the writer does (it says hello until the critic is there)
    instances = run(loop, "agent-swarm", [agent_args("critic", "a"), agent_args("writer", "a"),
                                          agent_args("writer", "b"), agent_args("critic", "b")])
    assert [i.exit_code for i in instances] == [0] * 4, [i.error for i in instances]
    critic_a, writer_a, writer_b, critic_b = (json.loads(messages(loop, i)[0]) for i in instances)
    tok = Tokenizer(loop.info.tokenizer)
    for writer, critic in ((writer_a, critic_a), (writer_b, critic_b)):
        assert (writer["role"], critic["role"]) == ("writer", "critic")
        assert len(writer["sent"]) == len(critic["sent"]) == ROUNDS
        assert critic["received"] == writer["sent"] and writer["received"] == critic["sent"]
        # what each said is its reply, and what it heard went into its context
        assert writer["sent"] == [g["text"] for g in writer["generations"][:ROUNDS]]
        assert critic["sent"] == [g["text"] for g in critic["generations"]]
        assert writer["result"] == writer["generations"][-1]["text"] and critic["result"] is None
        for draft, g in zip(critic["received"], critic["generations"]):
            assert tok.decode(g["prompt"]).endswith(f"Text: {draft}<|im_end|>\n<|im_start|>assistant\n")
        for critique, g in zip(writer["received"], writer["generations"][1:]):
            assert tok.decode(g["prompt"]).endswith(f"Critique: {critique}\nRewrite the text.<|im_end|>\n"
                                                    "<|im_start|>assistant\n")
    assert all(w["text"] for w in writer_a["generations"] + critic_a["generations"])
    # the order the instances started in, and another pair beside them, changed nothing
    assert (writer_a["generations"], critic_a["generations"]) == (writer_b["generations"], critic_b["generations"])
    for g in writer_a["generations"] + critic_a["generations"]:
        assert g["tokens"] == direct_greedy(inference, loop, g["prompt"], MAX_TOKENS)
        assert len(g["tokens"]) <= MAX_TOKENS
    assert_pools_full(loop)


def test_an_agent_alone_gives_up_after_its_wait(loop):
    critic, writer = run(loop, "agent-swarm", [agent_args("critic", "lonely-critic", "--wait-ms", "200"),
                                               agent_args("writer", "lonely-writer", "--wait-ms", "200")])
    assert (critic.exit_code, writer.exit_code) == (1, 1)
    assert "".join(events_of(loop, critic, "stderr")) == \
        "agent-swarm: a writer's hello on swarm 'lonely-critic' did not come within 200 ms\n"
    assert "".join(events_of(loop, writer, "stderr")) == \
        "agent-swarm: no critic answered on swarm 'lonely-writer' within 200 ms\n"
    assert_pools_full(loop)


@pytest.mark.parametrize("args, error", [
    ([], "the following arguments are required: ROLE, TASK"),
    (["judge", "t"], "argument ROLE: invalid choice: 'judge' (choose from writer, critic)"),
    (["writer", " "], "argument TASK: must not be empty"),
    (["writer", "t", "--rounds", "0"], "argument --rounds: expected a whole number from 1 to 16, not '0'"),
    (["critic", "t", "--rounds", "17"], "argument --rounds: expected a whole number from 1 to 16, not '17'"),
    (["writer", "t", "--swarm"], "argument --swarm: expected one argument"),
    (["writer", "t", "--x", "1"], "unrecognized arguments: --x 1"),
])
def test_bad_arguments_are_refused(loop, args, error):
    (stderr,) = refused(loop, "agent-swarm", [args])
    assert stderr.startswith("usage: agent-swarm [-h] [--swarm NAME]")
    assert stderr.endswith(f"agent-swarm: error: {error}\n")
