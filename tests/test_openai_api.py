"""The OpenAI-compatible endpoint of ``oven serve --openai-port``, driven by the real ``openai`` client
against a real server (tiny model): greedy answers equal ``oven run text-completion``, streamed
or not; sampling parameters, usage and errors as OpenAI's clients expect them."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from importlib.metadata import version
from pathlib import Path

import openai
import pytest
from harness import PROGRAM_DIR

from oven.client.programs import library_program
from oven.client.openai_api.errors import from_control
from oven.client.openai_api.limits import Limits
from oven.client.rpc import ControlRequestError, OvenClient
from oven.proto.control import ControlError
from oven.proto.endpoints import private_endpoint

PROMPT = "Name three colours."
MODEL = "tiny"


def http(method: str, url: str, body: bytes | None = None, key: str | None = None) -> tuple[int, dict]:
    """A raw request, for what OpenAI's client never sends (no key, a body that is not JSON)."""
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {key}"} if key else {})
    request = urllib.request.Request(url, data=body, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """(base URL, operator token, control endpoint, a client token of 'alice', who may run one instance)."""
    state, control, port = tmp_path_factory.mktemp("state"), private_endpoint(), free_port()
    cmd = [sys.executable, "-m", "oven.client.cli", "serve", "--model", MODEL, "--quiet", "--control-endpoint",
           control, "--state-dir", str(state), "--program-dir", PROGRAM_DIR, "--openai-port", str(port),
           "--max-instances-per-client", "1"]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "the OpenAI API did not come up"
            token_file = state / "operator.token"
            if token_file.exists():
                try:
                    if http("GET", f"{url}/models", key=token_file.read_text().strip())[0] == 200:
                        break
                except OSError:  # not listening yet
                    pass
            time.sleep(0.5)
        operator = token_file.read_text().strip()
        with OvenClient(control, token=operator) as client:
            alice = client.add_client("alice")
        yield url, operator, control, alice
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.fixture(scope="module")
def api(server) -> openai.OpenAI:
    url, operator, _, _ = server
    return openai.OpenAI(base_url=url, api_key=operator, max_retries=0)


def oven_run(control: str, token: str, *args: str) -> str:
    """stdout of ``oven run text-completion -- ARGS`` on the same server, less its final newline."""
    done = subprocess.run([sys.executable, "-m", "oven.client.cli", "run", "--server", control, "--token", token,
                           "text-completion", "--", *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.rsplit("\n", 2)[0]  # the completion, then the token ids (a message), each with a newline


@pytest.fixture(scope="module")
def greedy(server) -> dict[str, str]:
    """What ``oven run text-completion`` answers, greedily, for the chat and the plain prompt (8 tokens)."""
    _, operator, control, _ = server
    return {"chat": oven_run(control, operator, PROMPT, "8", "--chat"), "plain": oven_run(control, operator, PROMPT, "8")}


def test_models_lists_the_served_model(api):
    assert [m.id for m in api.models.list()] == [MODEL]
    assert api.models.retrieve(MODEL).id == MODEL


def test_chat_greedy_equals_oven_run(api, greedy):
    reply = api.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": PROMPT}],
                                        max_tokens=8, temperature=0)
    (choice,) = reply.choices
    assert choice.message.content == greedy["chat"]
    assert (choice.message.role, choice.finish_reason, reply.object) == ("assistant", "length", "chat.completion")
    assert reply.usage.completion_tokens == 8
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + 8


def test_completion_greedy_equals_oven_run(api, greedy):
    reply = api.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0)
    assert reply.choices[0].text == greedy["plain"]
    assert (reply.choices[0].finish_reason, reply.usage.completion_tokens) == ("length", 8)


def test_streamed_chat_equals_the_whole_answer(api, greedy):
    chunks = list(api.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": PROMPT}],
                                              max_tokens=8, temperature=0, stream=True,
                                              stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == greedy["chat"]
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 8


def test_streamed_completion_equals_the_whole_answer(api, greedy):
    chunks = list(api.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == greedy["plain"]
    assert chunks[-1].choices[0].finish_reason == "length"


def test_a_stop_string_cuts_the_answer(api, greedy):
    text = greedy["plain"]
    stop = text[len(text) // 2:len(text) // 2 + 2]
    reply = api.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0, stop=[stop])
    assert reply.choices[0].text == text[:text.index(stop)]
    assert reply.choices[0].finish_reason == "stop"
    streamed = api.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0, stop=stop, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == text[:text.index(stop)]


def test_seeded_samples_repeat_and_n_gives_n_choices(api):
    def ask():
        reply = api.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": PROMPT}],
                                            max_tokens=6, temperature=1.0, top_p=0.9, seed=7, n=3)
        return [c.message.content for c in sorted(reply.choices, key=lambda c: c.index)], reply.usage
    first, usage = ask()
    assert ask()[0] == first
    assert len(first) == 3 and len(set(first)) > 1  # seeds 7, 8, 9
    assert usage.completion_tokens <= 18


@pytest.mark.parametrize("kwargs, param, message", [
    (dict(temperature=3), "temperature", "3.0 is not in [0, 2] - 'temperature'"),
    (dict(n=0), "n", "n must be from 1 to 16, not 0"),
    (dict(logprobs=True, top_logprobs=21), "top_logprobs", "top_logprobs must be from 0 to 20, not 21"),
    (dict(presence_penalty=3), "presence_penalty", "3.0 is not in [-2, 2] - 'presence_penalty'"),
    (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}], tool_choice="maybe"),
     "tool_choice", "tool_choice must be 'none', 'auto', 'required' or {\"type\": \"function\", \"function\": "
                    "{\"name\": ...}}"),
    (dict(messages=[{"role": "wizard", "content": "hi"}]), "messages[0].role",
     "messages[0]: a message is an object whose 'role' is one of system, developer, user, assistant, tool"),
])
def test_bad_requests_get_400_naming_the_parameter(api, kwargs, param, message):
    request = dict(model=MODEL, messages=[{"role": "user", "content": PROMPT}], max_tokens=4) | kwargs
    with pytest.raises(openai.BadRequestError, match="Error code: 400") as caught:
        api.chat.completions.create(**request)
    assert caught.value.body == {"message": message, "type": "invalid_request_error", "param": param,
                                 "code": caught.value.body["code"]}


def test_an_unknown_model_is_404(api):
    with pytest.raises(openai.NotFoundError, match="The model `gpt-9` does not exist") as caught:
        api.completions.create(model="gpt-9", prompt=PROMPT, max_tokens=2)
    assert (caught.value.body["code"], caught.value.body["param"]) == ("model_not_found", "model")


def test_bad_api_keys_are_401(server):
    url, operator, _, _ = server
    server_hex = operator.split("-")[1]
    unknown = f"oven-{server_hex}-{'1' * 64}"  # well formed, for this server, but never admitted
    for key in ("sk-not-an-oven-token", unknown):
        api = openai.OpenAI(base_url=url, api_key=key, max_retries=0)
        with pytest.raises(openai.AuthenticationError, match="Incorrect API key provided"):
            api.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        with pytest.raises(openai.AuthenticationError, match="Incorrect API key provided"):
            api.models.list()
    status, body = http("POST", f"{url}/chat/completions", json.dumps({"model": MODEL, "messages": []}).encode())
    assert status == 401 and "You didn't provide an API key" in body["error"]["message"]


def test_a_refused_key_is_told_no_path_of_the_server(server):
    """Whoever sends a key the server does not admit is no client of it: its 401 names no socket or file."""
    url, operator, control, _ = server
    unknown = f"oven-{operator.split('-')[1]}-{'1' * 64}"
    api = openai.OpenAI(base_url=url, api_key=unknown, max_retries=0)
    for ask in (api.models.list, lambda: api.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2)):
        with pytest.raises(openai.AuthenticationError) as caught:
            ask()
        assert caught.value.body["message"] == (
            "Incorrect API key provided: this server does not admit it. An API key of this server is an oven "
            "token that its operator made (see `oven token add`).")
        assert control.removeprefix("ipc://") not in json.dumps(caught.value.body)


def test_max_tokens_is_bounded_by_the_context(server, api):
    """As OpenAI: a prompt and its completion fit the model's context together, or the request is a 400
    before any token is generated; a max_tokens that leaves no room for any prompt, before any launch."""
    url, operator, control, _ = server
    with OvenClient(control, token=operator) as client:
        context = Limits.of(client.info()).max_context
    assert context == 8192  # the tiny model's positions (its KvPage quota holds more)
    with pytest.raises(openai.BadRequestError) as caught:
        api.completions.create(model=MODEL, prompt=PROMPT, max_tokens=10**12)
    assert caught.value.body == {
        "message": f"This model's maximum context length is {context} tokens. However, you requested {10**12} "
                   "tokens for the completion alone. Please reduce max_tokens.",
        "type": "invalid_request_error", "param": "max_tokens", "code": "context_length_exceeded"}
    prompt_tokens = api.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": PROMPT}],
                                                max_tokens=1).usage.prompt_tokens
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as caught:
            api.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": PROMPT}],
                                        max_tokens=context - prompt_tokens + 1, stream=stream)
        assert caught.value.body["message"] == (
            f"This model's maximum context length is {context} tokens. However, you requested {context + 1} tokens "
            f"({prompt_tokens} in the messages, {context - prompt_tokens + 1} in the completion). Please reduce "
            "the length of the messages or completion.")
        assert (caught.value.body["param"], caught.value.body["code"]) == ("messages", "context_length_exceeded")
    reply = api.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2)  # the next request is served
    assert reply.usage.completion_tokens == 2


def test_a_prompt_past_the_context_is_400_before_any_forward(server, api):
    """Issue 42's figures: 8,131 prompt tokens + 300 on the 8,192 context, and 9,031 tokens (past one
    forward, too): a 400 naming the limit and the request's figures, at once, as the first answer (the
    client does not retry a 400); the instance tokenized the prompt and stopped, no batch was sent."""
    _, operator, control, _ = server
    words = {8131: 8100, 9031: 9000}  # "hello " x 8100 is 8131 tokens in the tiny model's chat template
    with OvenClient(control, token=operator) as client:
        batches = client.stats().num_batches
        for prompt_tokens, count in words.items():
            with pytest.raises(openai.BadRequestError) as caught:
                api.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hello " * count}],
                                            max_tokens=300)
            assert caught.value.body == {
                "message": f"This model's maximum context length is 8192 tokens. However, you requested "
                           f"{prompt_tokens + 300} tokens ({prompt_tokens} in the messages, 300 in the completion). "
                           "Please reduce the length of the messages or completion.",
                "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}
        assert client.stats().num_batches == batches
        ended = [i for i in client.instances() if i.program.endswith("chat-completion")][-2:]
        assert [(i.state, i.error) for i in ended] == [("finished", ""), ("finished", "")]


def test_choices_past_one_instances_kv_pages_are_400(server, api):
    """n choices fork the prompt: each holds its completion's pages and a copy of the prompt's last one;
    more than one instance's KvPage quota together is a 400 naming the quota, before any forward."""
    _, operator, control, _ = server
    with OvenClient(control, token=operator) as client:
        info = client.info()
    quota, size = info.max_kv_pages_per_instance, info.page_size
    max_tokens = 8000
    assert quota * size >= 8192 and 16 * (max_tokens // size + 1) > quota  # the case this test makes
    prompt_tokens = api.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1).usage.prompt_tokens
    pages = -(-prompt_tokens // size) + 16 * (max_tokens // size + 1)
    with pytest.raises(openai.BadRequestError) as caught:
        api.completions.create(model=MODEL, prompt=PROMPT, max_tokens=max_tokens, n=16)
    assert caught.value.body == {
        "message": f"This server holds at most {quota * size} tokens of KV cache for one request ({quota} pages "
                   f"of {size}). However, 1 prompt(s) of {prompt_tokens} tokens with 16 choice(s) of {max_tokens} "
                   f"tokens each need up to {pages} pages. Please reduce n, max_tokens or the prompt.",
        "type": "invalid_request_error", "param": "n", "code": "context_length_exceeded"}


def test_request_size_failures_of_the_server_are_400():
    """What the server answers a forward too large for it (a position past the model's, a batch past the
    largest, an instance past its KvPage quota) is the request's size: 400, which clients do not retry;
    any other failure of the run stays a 500."""
    from oven.client.openai_api.reply import failure
    from oven.client.openai_api.session import InferletFailed

    whys = ["bad_position: position 8192 is out of range", "batch_too_large: 9031 tokens",
            "kvpage quota exceeded: holding 255, asked for 4 more, quota is 256", "internal: boom"]
    errors = [failure(InferletFailed(f"the chat-completion inferlet failed: inferlet.tasks.OvenError: {why}"))
              for why in whys]
    statuses = {why: (error.status, error.code) for why, error in zip(whys, errors)}
    assert list(statuses.values()) == [(400, "context_length_exceeded")] * 3 + [(500, None)]


def test_a_list_of_prompts_gets_n_choices_each_in_order(api, server, greedy):
    """``prompt: [a, b]`` with n=2: choices 0 and 1 answer a, 2 and 3 answer b (greedy: each equal to the
    prompt asked alone), usage adds the prompts; streamed the same."""
    second = "Name three animals."
    alone = api.completions.create(model=MODEL, prompt=second, max_tokens=8, temperature=0)
    reply = api.completions.create(model=MODEL, prompt=[PROMPT, second], max_tokens=8, temperature=0, n=2)
    assert [(c.index, c.text) for c in reply.choices] == [(0, greedy["plain"]), (1, greedy["plain"]),
                                                          (2, alone.choices[0].text), (3, alone.choices[0].text)]
    plain = api.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1).usage.prompt_tokens
    assert reply.usage.prompt_tokens == plain + alone.usage.prompt_tokens
    assert reply.usage.completion_tokens == 32
    texts = ["", ""]
    for chunk in api.completions.create(model=MODEL, prompt=[PROMPT, second], max_tokens=8, temperature=0,
                                        stream=True):
        texts[chunk.choices[0].index] += chunk.choices[0].text
    assert texts == [greedy["plain"], alone.choices[0].text]
    for prompt, message in ((["a", ""], "prompt[1] must not be empty"), ([1, 2], "'prompt' must be a string or a "
                            "non-empty list of strings (token ids are not supported)")):
        with pytest.raises(openai.BadRequestError, match=re.escape(message)):
            api.completions.create(model=MODEL, prompt=prompt, max_tokens=2)


def test_max_tokens_past_the_context_is_refused_without_asking_the_server():
    from starlette.testclient import TestClient

    from oven.client.openai_api import app as app_module

    key = f"oven-{'2' * 64}-{'1' * 64}"  # well formed; no server is there to ask
    client = TestClient(app_module.create_app("ipc:///nonexistent/control.sock", "0" * 64, [MODEL], Limits(8192)))
    reply = client.post("/v1/completions", headers={"Authorization": f"Bearer {key}"},
                        json={"model": MODEL, "prompt": PROMPT, "max_tokens": 8192})
    assert reply.status_code == 400 and reply.json()["error"]["code"] == "context_length_exceeded"


def test_connections_slow_to_send_a_request_neither_lock_others_out_nor_stay(server):
    """Slowloris from one address (every local user's, 127.0.0.1): 300 connections that send half a
    request's headers and wait. Past MAX_WAITING_PER_PEER the oldest are closed; a request on a new
    connection from the same address is answered meanwhile; the rest are closed at REQUEST_TIMEOUT_S.
    (An idle keep-alive connection waits for a request too, so it may be closed, as after uvicorn's
    keep-alive timeout: hence a client of its own here.)"""
    from oven.client.openai_api.app import MAX_WAITING_PER_PEER, REQUEST_TIMEOUT_S

    url, operator, _, _ = server
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    slow = [socket.create_connection(("127.0.0.1", port)) for _ in range(300)]
    try:
        for sock in slow:
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Ty")
        api = openai.OpenAI(base_url=url, api_key=operator, max_retries=0)
        assert [m.id for m in api.models.list()] == [MODEL]  # not a 503
        for sock in slow:
            sock.setblocking(False)
        assert sum(_open(sock) for sock in slow) <= MAX_WAITING_PER_PEER
        for sock in slow:
            sock.settimeout(REQUEST_TIMEOUT_S + 60)
            try:
                assert sock.recv(1) == b""  # closed by the front end, having answered nothing
            except ConnectionResetError:
                pass
    finally:
        for sock in slow:
            sock.close()


def _open(sock: socket.socket) -> bool:
    """Is ``sock``'s peer still connected (nothing to read, no end of stream)?"""
    try:
        return sock.recv(1) != b""
    except BlockingIOError:
        return True
    except ConnectionResetError:
        return False


def test_malformed_bodies_and_unknown_routes_get_openai_errors(server):
    url, operator, _, _ = server
    status, body = http("POST", f"{url}/chat/completions", b"{nope", key=operator)
    assert status == 400 and body["error"]["message"].startswith("We could not parse the JSON body")
    assert http("POST", f"{url}/engines", b"{}", key=operator) == (404, {"error": {
        "message": "Invalid URL (POST /v1/engines)", "type": "invalid_request_error", "param": None, "code": None}})


def test_each_key_is_its_own_client_with_its_own_quota(server):
    """Alice's completion runs as her own instance; with her one instance (--max-instances-per-client 1)
    busy, her request is 429 while the operator's goes on."""
    url, operator, control, alice = server
    as_alice = openai.OpenAI(base_url=url, api_key=alice, max_retries=0)
    assert as_alice.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2).usage.completion_tokens == 2
    with OvenClient(control, token=operator) as op:
        assert [(i.program, i.state) for i in op.instances() if i.owner == "alice"] == [("chat-completion", "finished")]
    echo = library_program("echo")
    with OvenClient(control, token=alice) as client:
        waiting = client.launch(client.upload_file(echo.path, echo.name), [], detach=True)  # waits for messages
        try:
            with pytest.raises(openai.RateLimitError, match="too_many_instances"):
                as_alice.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2)
            api = openai.OpenAI(base_url=url, api_key=operator, max_retries=0)
            assert api.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2).usage.completion_tokens == 2
        finally:
            client.terminate(waiting)


def test_control_refusals_map_to_openai_statuses():
    """What a refusal of the control server is to an API user: a quota 429, another's instance 403, a
    connection the server dropped (the session starved past its lease) 503, anything else 500."""
    statuses = {code: from_control(ControlRequestError(ControlError(code, "why"))).status
                for code in ("too_many_instances", "upload_busy", "forbidden", "dropped", "internal")}
    assert statuses == {"too_many_instances": 429, "upload_busy": 429, "forbidden": 403, "dropped": 503,
                        "internal": 500}


def test_a_body_past_the_cap_is_413_before_it_is_read_whole(monkeypatch):
    """Whoever reaches the port costs the front end MAX_BODY_BYTES at most, declared or chunked; a
    well-formed key is enough to get that far, so the cap comes before any question to the server."""
    from starlette.testclient import TestClient

    from oven.client.openai_api import app as app_module

    monkeypatch.setattr(app_module, "MAX_BODY_BYTES", 1000)
    key = f"oven-{'2' * 64}-{'1' * 64}"  # well formed; no server is asked
    client = TestClient(app_module.create_app("ipc:///nonexistent/control.sock", "0" * 64, [MODEL], Limits(8192)))
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    body = json.dumps({"model": MODEL, "prompt": "x" * 2000}).encode()
    for content in (body, iter([body[:600], body[600:]])):  # declared, then chunked (no Content-Length)
        reply = client.post("/v1/completions", content=content, headers=headers)
        assert reply.status_code == 413, reply.text
        assert reply.json()["error"]["message"] == "The request body is larger than this server takes (0 MiB)."


def front_end_pid(url: str) -> int | None:
    """The pid of the OpenAI front end serving ``url`` (a process running openai_api.frontend), if any."""
    for proc in Path("/proc").iterdir():
        try:
            args = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"oven.client.openai_api.frontend" in args and url.encode() in args:
            return int(proc.name)
    return None


def test_a_front_end_that_dies_is_started_again(server):
    """``oven serve`` watches its front end like its inference process: one that dies is started again
    (said on stderr), rather than leaving the port accepting connections nobody serves."""
    url, operator, _, _ = server
    first = front_end_pid(url)
    os.kill(first, signal.SIGKILL)
    deadline = time.monotonic() + 120
    while True:
        assert time.monotonic() < deadline, "no front end came back"
        second = front_end_pid(url)
        if second not in (None, first):
            try:
                if http("GET", f"{url}/models", key=operator)[0] == 200:
                    break
            except OSError:  # the new one is not serving yet
                pass
        time.sleep(0.5)


def test_version_and_health_need_no_key(server):
    url, _, _, _ = server
    base = url.removesuffix("/v1")
    status, body = http("GET", f"{base}/version")
    assert (status, body["models"], body["version"]) == (200, [MODEL], version("oven"))
    assert http("GET", f"{base}/health") == (200, {"status": "ok", "replicas": 1, "replicas_serving": 1})


def inference_pid(url: str) -> int:
    """The inference process of the ``oven serve`` whose OpenAI front end serves ``url``."""
    status = Path(f"/proc/{front_end_pid(url)}/status").read_text()
    serve = int(next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:")))
    children = subprocess.run(["pgrep", "-P", str(serve)], capture_output=True, text=True).stdout.split()
    (pid,) = [int(c) for c in children if b"oven.inference.server" in Path(f"/proc/{c}/cmdline").read_bytes()]
    return pid


def test_health_follows_an_inference_restart(server, api):
    """/health is 503 while the inference process is down or loading again, then 200; completions are
    served again and the control's metrics count the restart. (Last in this module: it kills the
    module server's inference process.)"""
    url, operator, control, _ = server
    base = url.removesuffix("/v1")
    os.kill(inference_pid(url), signal.SIGKILL)
    seen, deadline = [], time.monotonic() + 180
    while seen[-1:] != [200] or 503 not in seen:
        assert time.monotonic() < deadline, f"/health answered {seen[-5:]}"
        status, body = http("GET", f"{base}/health")
        if not seen or seen[-1] != status:
            seen.append(status)
        if status == 503:
            assert body["status"] in ("loading", "unavailable"), body
    assert seen[-2:] == [503, 200]
    assert api.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2).usage.completion_tokens == 2
    with OvenClient(control, token=operator) as client:
        assert "oven:inference_restarts_total 1.0" in client.metrics().splitlines()
