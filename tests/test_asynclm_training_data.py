"""AsyncLM training samples (client/asynclm/training): LPT and traps on hand-made DAGs, masks,
determinism, the split, and token-exactness against the inferlet's own context."""

from __future__ import annotations

import json

import pytest
from harness import messages

from oven.client.asynclm.session import Workload, session_spec
from oven.client.asynclm.tools import demo_registry
from oven.client.asynclm.training import protocol
from oven.client.asynclm.training.data import DataConfig, build, parse_weights, write
from oven.client.asynclm.training.plain import plain_sync
from oven.client.asynclm.training.segments import Encoder, flatten, loss_weights
from oven.client.asynclm.training.simulate import CmlSimulation, Timing
from oven.client.asynclm.training.split import bfcl_ids, demo_pools
from oven.client.asynclm.training.tasks import FollowUp, Subtask, Task, fixed_call
from oven.control.tokenizer import Tokenizer
from oven.inference.models import resolve_model

PROGRAMS = ["asynclm"]  # for the `loop` fixture (conftest.py)
LOOP_CONFIG = dict(max_kv_pages_per_instance=64)  # the demo tools' prompt is ~560 tokens
SMALL = DataConfig(demo_train=12, demo_eval=4, multi_turn_train=2, multi_step_train=1, multi_step_eval=1,
                   weights=parse_weights("async=0.5,sync-cml=0.3,sync=0.2"), group=4,
                   sources=("demo", "parallel", "live_parallel", "multi_turn", "multi_step_parallel"))


@pytest.fixture(scope="module")
def encoder() -> Encoder:
    return Encoder(Tokenizer(resolve_model("tiny").tokenizer))


def single(call: str) -> Subtask:
    return Subtask((fixed_call(call),), lambda r: f"{call} gave {json.dumps(r[0])}.", lambda r: [json.dumps(r[0])])


def demo_task(*subtasks: Subtask, question: str = "Do it.") -> Task:
    return Task("hand", "demo", question, subtasks, demo_registry)


ESTIMATES = {"get_weather": 300, "get_stock_price": 200, "search_web": 800, "calculate": 100,
             "convert_currency": 250, "get_time": 150}
PRICE_IN_EUR = Subtask(
    (fixed_call('get_stock_price(symbol="AAPL")'),
     lambda r: f'convert_currency(amount={r[0]["price_usd"]}, from_currency="USD", to_currency="EUR")'),
    lambda r: f"AAPL is {r[1]['amount']} EUR.")


def texts(encoder: Encoder, transcript) -> list[tuple[str, str]]:
    return [(s.role, encoder.decode(s.token_ids)) for s in transcript.segments[1:]]


def test_async_writes_longest_first_and_traps_when_every_ready_call_waits(encoder):
    weather, stock, time = (single('get_weather(city="Oslo")'), single('get_stock_price(symbol="AAPL")'),
                            single('get_time(timezone="UTC")'))
    estimates = {**ESTIMATES, "get_weather": 600, "get_stock_price": 300, "get_time": 150}
    transcript = CmlSimulation(demo_task(time, weather, stock), encoder, Timing(estimates, 5.0), "async").run()
    assert transcript.calls == ['get_weather(city=" Oslo")', 'get_stock_price(symbol=" AAPL")',
                                'get_time(timezone=" UTC")']
    got = texts(encoder, transcript)
    model = "".join(t for role, t in got if role == "model")
    # calls of 21, 24 and 21 tokens at 5 ms: written by 105, 225 and 330 ms, so none is back before the trap
    assert model.startswith('[CALL] t1 [HEAD] get_weather(city=" Oslo") [END]\n[CALL] t2 [HEAD] get_stock_price('
                            'symbol=" AAPL") [END]\n[CALL] t3 [HEAD] get_time(timezone=" UTC") [END]\n[TRAP][END]')
    intr_order = [t.split()[1] for role, t in got if role == "interrupt"]
    assert intr_order == ["t3", "t2", "t1"]  # back at 330+150, 225+300, 105+600 ms
    # one wait, for t3; the sentences for t3 and t2 are written while the others run, and their
    # interrupts wait for the sentence's end: every interrupt starts a line
    assert [role for role, _ in got] == ["model", "interrupt"] * 3 + ["model"]
    assert all(text.endswith("\n") for role, text in got[:-1] if role == "model")
    assert transcript.num_traps == 1 and model.endswith("<|im_end|>")


def test_dependent_chain_traps_then_calls_with_the_result(encoder):
    transcript = CmlSimulation(demo_task(PRICE_IN_EUR), encoder, Timing(ESTIMATES, 5.0), "async").run()
    got = texts(encoder, transcript)
    price = json.loads(got[1][1].split("[HEAD]")[1].split("[END]")[0])["price_usd"]
    assert [role for role, _ in got] == ["model", "interrupt", "model", "interrupt", "model"]
    assert got[0][1] == '[CALL] t1 [HEAD] get_stock_price(symbol=" AAPL") [END]\n[TRAP][END]\n'
    assert got[2][1] == (f'[CALL] t2 [HEAD] convert_currency(amount={price}, from_currency=" USD", to_currency=" EUR")'
                         ' [END]\n[TRAP][END]\n')
    assert got[4][1].startswith("AAPL is ") and transcript.num_traps == 2


def test_interrupts_land_only_outside_cml_blocks_at_the_start_of_a_line(encoder):
    # t1 is back (at ~510 + 100 ms) while t2 is being written (until ~1080 ms): it waits for the end
    # of t2's line
    first = single("calculate(expression=\"1 + 1\")")
    second = single('search_web(query="python asyncio tutorial")')
    estimates = {**ESTIMATES, "calculate": 100, "search_web": 50}
    transcript = CmlSimulation(demo_task(second, first), encoder, Timing(estimates, 30.0), "async").run()
    got = texts(encoder, transcript)
    assert got[0] == ("model", '[CALL] t1 [HEAD] calculate(expression=" 1 + 1") [END]\n'
                               '[CALL] t2 [HEAD] search_web(query=" python asyncio tutorial") [END]\n')
    assert got[1] == ("interrupt", "[INTR] t1 [HEAD] 2 [END]\n")
    for role, text in got:
        if role == "model":
            assert text.count("[CALL]") == text.count("[END]") - text.count("[TRAP]")


def test_sync_cml_waits_after_every_call_in_task_order(encoder):
    subtasks = (single('get_time(timezone="UTC")'), single('search_web(query="jazz history")'))
    transcript = CmlSimulation(demo_task(*subtasks), encoder, Timing(ESTIMATES, 20.0), "sync-cml").run()
    got = texts(encoder, transcript)
    assert [role for role, _ in got] == ["model", "interrupt", "model", "interrupt", "model"]
    assert got[0][1] == '[CALL] t1 [HEAD] get_time(timezone=" UTC") [END]\n'
    assert transcript.num_traps == 0


def test_masks_cover_what_the_model_writes_and_nothing_else(encoder):
    follow = Task("hand", "demo", "Weather in Oslo?", (single('get_weather(city="Oslo")'),), demo_registry,
                  follow_up=FollowUp("Also, the time in UTC?", single('get_time(timezone="UTC")')))
    transcript = CmlSimulation(follow, encoder, Timing(ESTIMATES, 10.0, follow_up_ms=20.0), "async").run()
    ids, spans = flatten(transcript.segments)
    mask = [w > 0 for w in loss_weights(len(ids), spans)]
    position = 0
    roles = set()
    for segment in transcript.segments:
        roles.add(segment.role)
        span = mask[position:position + len(segment.token_ids)]
        assert all(span) if segment.role == "model" else not any(span)
        position += len(segment.token_ids)
    assert roles == {"prompt", "model", "interrupt", "user"}
    masked_text = encoder.decode([t for t, m in zip(ids, mask) if m])
    for written in ("[CALL] t1", "[TRAP][END]", "Oslo", "<|im_end|>"):
        assert written in masked_text
    for unwritten in ("[INTR]", "Also, the time", "You call functions", "Weather in Oslo?", "<|im_start|>"):
        assert unwritten not in masked_text


def test_plain_sync_turns_render_as_the_whole_conversation(encoder):
    task = demo_task(PRICE_IN_EUR, single('get_weather(city="Oslo")'))
    transcript = plain_sync(task, encoder, Timing(ESTIMATES, 10.0))
    ids, spans = flatten(transcript.segments)
    whole = encoder.decode(ids)
    assert encoder.encode(whole) == ids  # turn boundaries are special tokens: per-turn = whole tokenization
    assert transcript.calls[:2] == ['get_stock_price(symbol=" AAPL")', 'get_weather(city=" Oslo")']
    assert "<|im_start|>tool\n" in whole and "[CALL]" not in whole
    model = [encoder.decode(ids[s:e]) for s, e in spans]
    assert model[0] == 'get_stock_price(symbol=" AAPL")\nget_weather(city=" Oslo")<|im_end|>'


def test_generation_is_deterministic_and_the_split_is_disjoint(encoder, tmp_path):
    runs = []
    for out in ("a", "b"):
        evaluation, _ = build("eval", SMALL, encoder)
        train, _ = build("train", SMALL, encoder, frozenset(r["question"] for r in evaluation))
        runs.append(write({"train": train, "eval": evaluation}, tmp_path / out, {}))
    assert runs[0] == runs[1]
    assert (tmp_path / "a" / "train.jsonl").read_bytes() == (tmp_path / "b" / "train.jsonl").read_bytes()
    other = build("train", DataConfig(**{**SMALL.__dict__, "seed": 1}), encoder)[0]
    assert [r["ids"] for r in other] != [r["ids"] for r in train]
    assert {r["variant"] for r in evaluation if r["source"] == "demo"} == {"async", "sync-cml", "sync"}
    # BFCL: no evaluation id in training, compositions included
    for kind in ("parallel", "live_parallel", "multi_turn"):
        assert not set(bfcl_ids(kind, "train")) & set(bfcl_ids(kind, "eval"))
    eval_ids = set(bfcl_ids("multi_turn", "eval")) | set(bfcl_ids("parallel", "eval"))
    train_sources = {r["task_id"].split("#")[0] for r in train if r["source"] != "demo"}
    assert train_sources and not train_sources & eval_ids
    # demo: no held-out entity in any training task
    held = demo_pools("eval", ("AUD", "CHF"))
    train_text = " ".join(r["question"] + " " + " ".join(r["calls"]) + " " + (r["follow_up"] or "") for r in train)
    for entity in held.cities + held.symbols + held.search_queries + held.held_out_currencies:
        assert f'"{entity}"' not in train_text
    assert not {r["question"] for r in train} & {r["question"] for r in evaluation}


def test_training_names_are_made_up_or_rare_and_never_held_out(encoder):
    import random

    from oven.client.asynclm.training.names import NameMaker, vocabulary_words

    words = vocabulary_words(encoder.tokenizer)
    assert len(words.proper) > 1000 and len(words.common) > 5000 and "Zurich" in words.proper
    held = demo_pools("eval", ("AUD", "CHF"))
    forbidden = set(held.cities + held.symbols + held.search_queries + held.held_out_currencies)
    names = NameMaker(random.Random(0), words, forbidden)
    made = [names.city() for _ in range(3000)] + [names.symbol() for _ in range(3000)] + \
        [names.query() for _ in range(1000)]
    assert not {m.lower() for m in made} & {f.lower() for f in forbidden}
    assert len(set(made)) > 5000 and all(m.strip() == m and m for m in made)


def test_small_talk_needs_no_call(encoder):
    task = demo_task(Subtask((), lambda r: "Hello! Ask me anything."), question="Hi!")
    transcript = CmlSimulation(task, encoder, Timing(ESTIMATES, 10.0), "async").run()
    assert transcript.calls == [] and texts(encoder, transcript) == [("model", "Hello! Ask me anything.\n<|im_end|>")]
    assert plain_sync(task, encoder, Timing(ESTIMATES, 10.0)).calls == []


def test_irrelevance_tasks_make_no_call_and_say_so(encoder):
    from oven.client.asynclm.training.bfcl_tasks import IRRELEVANCE_KINDS, NO_CALL_REPLY

    config = DataConfig(sources=IRRELEVANCE_KINDS, irrelevance_train=3, weights=parse_weights("async=1,sync=1"))
    train, dropped = build("train", config, encoder)
    assert [r["task_id"] for r in train] == [*bfcl_ids("irrelevance", "train")[:3],
                                            *bfcl_ids("live_irrelevance", "train")[:3]]
    for record in train:
        assert record["calls"] == [] and record["facts"] == []
        written = [encoder.decode(record["ids"][s:e]) for s, e in record["loss_spans"]]
        assert written == [NO_CALL_REPLY + ("\n" if record["variant"] == "async" else "") + "<|im_end|>"]
    assert {r["variant"] for r in train} == {"async", "sync"}
    for kind in IRRELEVANCE_KINDS:  # held out: no evaluation id in training, a quarter for training
        train_ids, eval_ids = bfcl_ids(kind, "train"), bfcl_ids(kind, "eval")
        assert not set(train_ids) & set(eval_ids) and len(train_ids) == (len(train_ids) + len(eval_ids)) // 4


def test_mismatched_tasks_put_a_samples_tools_beside_a_request_they_do_not_serve():
    import random

    from oven.client.asynclm.training.bfcl_tasks import NO_CALL_REPLY, bfcl_tasks, mismatched_tasks

    parallel = bfcl_tasks("parallel", "train", random.Random(0))
    tools_of = {frozenset(t.name for t in task.registry()): task.question for task in parallel}
    made = mismatched_tasks(random.Random(0), 8)
    assert [t.question for t in made] == [t.question for t in mismatched_tasks(random.Random(0), 8)]
    for task in made:
        tools = frozenset(t.name for t in task.registry())
        assert tools in tools_of and task.question != tools_of[tools]  # another sample's question...
        asked = next(names for names, question in tools_of.items() if question == task.question)
        assert not tools & asked  # ...that none of these tools serves
        assert [s.steps for s in task.subtasks] == [()] and task.subtasks[0].sentence([]) == NO_CALL_REPLY
    assert len({t.question for t in made}) > 1


def test_off_topic_requests_need_no_call_and_the_held_out_ones_are_never_trained_on():
    from dataclasses import replace

    from oven.client.asynclm.training.data import tasks_for
    from oven.client.asynclm.training.demo_tasks import OFF_TOPIC_HELD_OUT, OFF_TOPIC_TRAIN, TRAINING_MIX

    def questions(off_topic: float) -> list[str]:
        mix = replace(TRAINING_MIX, small_talk=0, off_topic=off_topic)
        config = DataConfig(demo_train=40, sources=("demo",), mix=mix)
        return [t.question for t in tasks_for("train", config) if not any(s.steps for s in t.subtasks)]
    trained = {question for question, _ in OFF_TOPIC_TRAIN}
    assert not trained & set(OFF_TOPIC_HELD_OUT)
    assert not set(questions(0)) & trained
    assert set(questions(1)) <= trained and len(questions(1)) == 40
    with pytest.raises(ValueError, match="off-topic is a chance"):
        replace(TRAINING_MIX, off_topic=2)


def test_the_training_mix_sets_how_many_chains_depend_on_a_result():
    from dataclasses import replace

    from oven.client.asynclm.training.data import tasks_for
    from oven.client.asynclm.training.demo_tasks import TRAINING_MIX

    def dependent(mix) -> int:
        tasks = tasks_for("train", DataConfig(demo_train=200, sources=("demo",), mix=mix))
        return sum(len(sub.steps) > 1 for task in tasks for sub in task.subtasks)
    assert dependent(replace(TRAINING_MIX, dependent_weight=0)) == 0
    assert 0 < dependent(replace(TRAINING_MIX, dependent_weight=1)) < dependent(TRAINING_MIX)
    # the evaluation tasks do not follow the training mix
    evaluation = DataConfig(demo_eval=20, sources=("demo",))
    assert [t.question for t in tasks_for("eval", evaluation)] == \
        [t.question for t in tasks_for("eval", replace(evaluation, mix=replace(TRAINING_MIX, dependent_weight=0)))]
    with pytest.raises(ValueError, match="made-up is a chance"):
        replace(TRAINING_MIX, made_up=1.5)


def test_contrast_pairs_a_request_with_a_same_kind_one_that_needs_a_next_call():
    from dataclasses import replace

    from oven.client.asynclm.training.data import tasks_for
    from oven.client.asynclm.training.demo_tasks import TRAINING_MIX
    from oven.client.asynclm.training.tasks import function_name

    def contrasted(task) -> bool:
        chains = task.subtasks + ((task.follow_up.subtask,) if task.follow_up else ())
        first = {(function_name(sub.call(0, [])), len(sub.steps)) for sub in chains if sub.steps}
        return any((name, 1) in first and (name, 2) in first for name in ("get_weather", "get_stock_price"))

    config = DataConfig(demo_train=60, sources=("demo",), mix=replace(TRAINING_MIX, contrast=1, small_talk=0))
    tasks = tasks_for("train", config)
    assert all(contrasted(task) for task in tasks)
    plain = tasks_for("train", replace(config, mix=replace(config.mix, contrast=0)))
    assert sum(map(contrasted, plain)) < len(plain) // 2
    # the pair is not always first, and evaluation tasks do not follow the training mix
    assert any(not contrasted(replace(task, subtasks=task.subtasks[:2], follow_up=None)) for task in tasks)
    evaluation = DataConfig(demo_eval=20, sources=("demo",))
    assert [t.question for t in tasks_for("eval", evaluation)] == \
        [t.question for t in tasks_for("eval", replace(evaluation, mix=config.mix))]


def test_bad_variant_weights_are_refused():
    with pytest.raises(ValueError, match="bad variant weight 'async=x'"):
        parse_weights("async=x")
    with pytest.raises(ValueError, match="variant weights must name"):
        DataConfig(weights=parse_weights("fast=1"))


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_samples_are_the_tokens_the_inferlet_builds(loop, encoder, mode):
    """The inferlet, its calls pinned to the simulated model's, on the simulated times: its context is
    the sample's ids up to the answer (the plan stops there), the system prompt holding the plan's
    cheat sheet as the inferlet adds it."""
    variant = "async" if mode == "async" else "sync-cml"
    task = demo_task(PRICE_IN_EUR) if mode == "async" else demo_task(
        single('get_weather(city="Oslo")'), single('get_time(timezone="Asia/Tokyo")'))
    timing = Timing({**ESTIMATES, "get_stock_price": 1000, "convert_currency": 1000}, 5.0)
    transcript = CmlSimulation(task, encoder, timing, variant).run()
    registry = task.registry(timing.estimate_ms_by_name)
    system = protocol.prompt().system_prompt(registry.describe(), transcript.calls)
    ids, _ = flatten([encoder.prompt(system, task.question)] + transcript.segments[1:])
    workload = Workload("hand", task.question, registry, [[call] for call in transcript.calls] if mode == "sync"
                        else [transcript.calls])
    spec = session_spec(workload, mode, kv="keep", answer_tokens=0, report_context=True)
    inst = loop.launch("asynclm", [json.dumps(spec)])
    seen, answered = 0, set()

    def step() -> bool:
        nonlocal seen
        events = [json.loads(m) for m in messages(loop, inst)]
        for event in events[seen:]:
            calls = [e for e in events if e["type"] == "call" and e["id"] not in answered]
            # async: answer while the model waits at its trap, as the simulated times say
            if (event["type"] == "trap" if mode == "async" else event["type"] == "call"):
                for call in calls:
                    answered.add(call["id"])
                    inst.inbox.push(json.dumps({"type": "result", "id": call["id"],
                                                "value": registry.execute(call["call"])}))
        seen = len(events)
        return not inst.alive
    assert loop.run_until(step, 120)
    assert inst.exit_code == 0, inst.error
    done = json.loads(messages(loop, inst)[-1])
    context = done["context"]
    assert ids[:len(context)] == context
    assert transcript.segments[-1].role == "model" and len(ids) - len(context) == len(transcript.segments[-1].token_ids)
    assert transcript.segments[0].token_ids == encoder.prompt(protocol.prompt().system_prompt(registry.describe()),
                                                              task.question).token_ids


def test_bfcl_calls_are_trained_in_keyword_form_only():
    """BFCL's multi-turn ground truth passes some arguments by position; training names them all."""
    import random

    from oven.client.asynclm.tools import parse_call
    from oven.client.asynclm.tools.bfcl_data import ground_truth_by_id
    from oven.client.asynclm.training.bfcl_tasks import bfcl_tasks

    truth = ground_truth_by_id("BFCL_v4_multi_turn_base.json")
    first_turns = {sample_id: turns[0] for sample_id, turns in truth.items()}
    tasks = bfcl_tasks("multi_turn", "train", random.Random(0))
    positional = 0
    for task in tasks:
        written = [parse_call(s.call(k, [])) for s in task.subtasks for k in range(len(s.steps))]
        given = [parse_call(call) for call in first_turns[task.task_id]]
        registry = task.registry()  # the called functions and a few others: enough to name the calls
        positional += sum(bool(call.args) for call in given)
        assert not any(call.args for call in written)
        assert written == [registry.named(call) for call in given]
    assert positional > 0  # the training side has positional calls to name


def test_the_verb_refuses_an_out_it_cannot_use_or_would_overwrite_before_any_work(tmp_path, capsys):
    from oven.client.cli import main

    def refused(*argv: str) -> str:
        assert main(["asynclm-data", *argv]) == 1
        err = capsys.readouterr().err
        assert err.startswith("oven asynclm-data: error: ") and err.count("\n") == 1, err
        return err.strip()

    small = ["--model", "tiny", "--sources", "demo", "--demo-train", "1", "--demo-eval", "1"]
    (tmp_path / "file").write_text("")
    assert refused("--out", str(tmp_path / "file"), *small).endswith(f"{tmp_path / 'file'} is a file, not a folder")
    assert refused("--out", str(tmp_path / "new"), "--max-tokens", "0", *small).endswith("max_tokens must be >= 1, got 0")
    assert refused("--out", str(tmp_path / "new"), "--max-tokens", "10", *small).endswith(
        "all 4 samples are longer than --max-tokens 10; nothing written")
    assert not (tmp_path / "new").exists()
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    (earlier / "train.jsonl").write_text("mine\n")
    assert refused("--out", str(earlier), *small).endswith(
        "holds an earlier run's train.jsonl: --overwrite writes over it, or give another --out")
    assert [p.name for p in earlier.iterdir()] == ["train.jsonl"] and (earlier / "train.jsonl").read_text() == "mine\n"
    assert main(["asynclm-data", "--out", str(earlier), "--overwrite", *small]) == 0
    assert (earlier / "train.jsonl").read_text() != "mine\n" and (earlier / "data.json").is_file()
