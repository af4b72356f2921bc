"""`flaxheads serve` as a real process on a free loopback port, queried over HTTP with httpx: every
route and task answers as `flaxheads.pipeline(...)` does in this process (1e-6), alone and in a
random concurrent mix of lengths and tasks (so answers cannot depend on batch mates), every bad
input is a 4xx JSON error naming its field and fix, the request cap answers 429, and SIGTERM lets
a request in flight finish. One server (tests/serve_models.py's seven tiny models) serves the
module; SIGTERM, last, stops it. With two CPU devices (a process of its own), every task's forward
passes split their rows over both and answer as one device."""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import httpx
import numpy as np
import pytest

import flaxheads
from flaxheads.atomic import INCOMPLETE_MARKER
from flaxheads.conversion.checkpoint_io import CheckpointError
from flaxheads.model import UntrainedModel
from flaxheads.serving import models as served_models
from flaxheads.serving import open_models
from jobs import free_port
from serve_models import MAX_POSITIONS, build

pytestmark = pytest.mark.slow  # a server compiling 7 tiny models in 41 shapes, and this process's pipelines

ATOL = 1e-6
MAX_BATCH_TOKENS = 128  # 2 rows of 64 tokens a forward pass: few shapes to compile
CAP = 8
PAYLOAD_LIMIT = 20_000
TEXTS = ["a good film", "the plot was so dull and boring , the worst movie", "great",
         " ".join(["a very good story and a great plot ,"] * 6)]  # the last: 49 tokens, the 64 bucket
LONG = " ".join(["the film was good , the plot was bad ."] * 12)  # 120 tokens: more than the models read
QUESTIONS = [{"question": "what was good ?", "context": "the film was very good and the plot was bad"},
             {"question": "what was the plot ?", "context": LONG}]
CHOICES = [{"context": "the film was good", "choices": ["a great story", "the worst plot , so dull and boring"]},
           {"context": TEXTS[3], "question": "the film was", "choices": ["good", "bad", "so dull", "the best movie"]},
           {"context": LONG, "choices": ["good", "bad , very bad"]}]  # the last: cut with truncate


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return build(tmp_path_factory.mktemp("served"))


@pytest.fixture(scope="module")
def server(folders):
    """The base URL of `flaxheads serve` over every model of `folders`, and its process."""
    port = free_port()
    err = tempfile.TemporaryFile("w+")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "flaxheads.cli", "serve", *map(str, folders.values()), "--port", str(port),
         "--max_batch_tokens", str(MAX_BATCH_TOKENS), "--max_concurrent_requests", str(CAP),
         "--payload_limit", str(PAYLOAD_LIMIT)], stdout=subprocess.DEVNULL, stderr=err, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                break
        except httpx.TransportError:
            time.sleep(0.5)
    if proc.poll() is not None or time.monotonic() >= deadline:
        proc.kill()
        err.seek(0)
        pytest.fail(f"the server did not start:\n{err.read()[-4000:]}")
    proc.url, proc.stderr_file = url, err
    yield proc
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    err.close()


@pytest.fixture(scope="module")
def pipes(folders):
    """This process's pipelines over the served folders (forward passes of the server's shapes,
    so the compilation cache serves them; the answers are the same with any shapes)."""
    options = {"text-classification": dict(batch_size=2, pad_to_multiple_of=0),
               "token-classification": dict(batch_size=2, pad_to_multiple_of=0),
               "question-answering": dict(batch_size=2), "multiple-choice": dict(batch_size=2, pad_to_multiple_of=0)}
    tasks = {"sentiment": "text-classification", "topics": "text-classification", "ranker": "text-classification",
             "reward": "text-classification", "tagger": "token-classification", "reader": "question-answering",
             "chooser": "multiple-choice"}
    return {name: flaxheads.pipeline(task, model=str(folders[name]), **options[task]) for name, task in tasks.items()}


def _ranked(pipe, query, texts, function, return_text=False):
    scores = [answer["score"] for answer in pipe([{"text": query, "text_pair": t} for t in texts],
                                                 function_to_apply=function)]
    ranks = [{"index": i, "score": s, **({"text": texts[i]} if return_text else {})} for i, s in enumerate(scores)]
    return sorted(ranks, key=lambda rank: rank["score"], reverse=True)


CASES = {
    # name: (route, body, the pipeline's answer)
    "predict_one_text": ("predict", {"inputs": TEXTS[1], "model": "sentiment"},
                         lambda p: p["sentiment"](TEXTS[1], top_k=None)),
    "predict_batch_raw_scores": ("predict", {"inputs": [[t] for t in TEXTS], "model": "sentiment", "raw_scores": True},
                                 lambda p: p["sentiment"](TEXTS, top_k=None, function_to_apply="none")),
    "predict_truncated": ("predict", {"inputs": LONG, "model": "sentiment", "truncate": True},
                          lambda p: p["sentiment"](LONG, top_k=None)),
    # Longest first: the server cuts the batch into forward passes of like length, shortest first,
    # and each answer must still go back to its own input.
    "predict_batch_longest_first": ("predict", {"inputs": [[t] for t in TEXTS[::-1]], "model": "sentiment"},
                                    lambda p: p["sentiment"](TEXTS[::-1], top_k=None)),
    "predict_multi_label": ("predict", {"inputs": [[t] for t in TEXTS], "model": "topics"},
                            lambda p: p["topics"](TEXTS, top_k=None)),
    "predict_multi_label_thresholds": ("predict", {"inputs": [[t] for t in TEXTS], "model": "topics",
                                                   "apply_thresholds": True},
                                       lambda p: p["topics"](TEXTS, apply_thresholds=True)),
    "predict_pair": ("predict", {"inputs": ["good film", TEXTS[1]], "model": "ranker"},
                     lambda p: p["ranker"]({"text": "good film", "text_pair": TEXTS[1]}, top_k=None)),
    "predict_regression_pairs": ("predict", {"inputs": [["good film", t] for t in TEXTS], "model": "ranker"},
                                 lambda p: p["ranker"]([{"text": "good film", "text_pair": t} for t in TEXTS],
                                                       top_k=None)),
    "rerank": ("rerank", {"query": "good film", "texts": TEXTS, "return_text": True, "model": "ranker"},
               lambda p: _ranked(p["ranker"], "good film", TEXTS, "sigmoid", return_text=True)),
    "rerank_raw_scores": ("rerank", {"query": "dull", "texts": TEXTS, "raw_scores": True, "model": "ranker"},
                          lambda p: _ranked(p["ranker"], "dull", TEXTS, "none")),
    "reward": ("reward", {"inputs": [[t] for t in TEXTS], "model": "reward"},
               lambda p: [{"score": a["score"]} for a in p["reward"](TEXTS, function_to_apply="none")]),
    "reward_one_text": ("reward", {"inputs": TEXTS[0], "model": "reward"},
                        lambda p: {"score": p["reward"](TEXTS[0], function_to_apply="none")[0]["score"]}),
    "tokens": ("token_classification", {"inputs": TEXTS}, lambda p: p["tagger"](TEXTS)),
    "tokens_simple_one_text": ("token_classification", {"inputs": TEXTS[1], "aggregation_strategy": "simple"},
                               lambda p: p["tagger"](TEXTS[1], aggregation_strategy="simple")),
    "tokens_first_no_ignored": ("token_classification", {"inputs": TEXTS, "aggregation_strategy": "first",
                                                         "ignore_labels": []},
                                lambda p: p["tagger"](TEXTS, aggregation_strategy="first", ignore_labels=[])),
    # Longest first: the server cuts a token batch into passes of like length too.
    "tokens_longest_first": ("token_classification", {"inputs": TEXTS[::-1], "aggregation_strategy": "simple"},
                             lambda p: p["tagger"](TEXTS[::-1], aggregation_strategy="simple")),
    "tokens_stride": ("token_classification", {"inputs": [LONG], "aggregation_strategy": "max", "stride": 16},
                      lambda p: p["tagger"]([LONG], aggregation_strategy="max", stride=16)),
    "question": ("question_answering", {"inputs": QUESTIONS[0]}, lambda p: p["reader"](QUESTIONS[0])),
    "questions_top_k_windows": ("question_answering", {"inputs": QUESTIONS, "top_k": 3, "doc_stride": 16},
                                lambda p: p["reader"](QUESTIONS, top_k=3, doc_stride=16)),
    "question_impossible": ("question_answering", {"inputs": [QUESTIONS[1]], "handle_impossible_answer": True},
                            lambda p: [p["reader"](QUESTIONS[1], handle_impossible_answer=True)]),
    "choice_one": ("multiple_choice", {"inputs": CHOICES[0]}, lambda p: p["chooser"](CHOICES[0])),
    # Inputs of 4 and 2 choices in one request (their choices share forward passes): each as alone.
    "choices_of_several_counts": ("multiple_choice", {"inputs": CHOICES[1::-1]},
                                  lambda p: [p["chooser"](c) for c in CHOICES[1::-1]]),
    "choices_truncated": ("multiple_choice", {"inputs": CHOICES, "truncate": True},
                          lambda p: [p["chooser"](c) for c in CHOICES]),
}


def assert_same(served, expected, where: str = "answer") -> None:
    """The same nesting and keys, equal strings and ints, floats within ATOL."""
    if isinstance(expected, dict):
        assert isinstance(served, dict) and list(served) == list(expected), f"{where}: {served} != {expected}"
        for key in expected:
            assert_same(served[key], expected[key], f"{where}.{key}")
    elif isinstance(expected, list):
        assert isinstance(served, list) and len(served) == len(expected), f"{where}: {served} != {expected}"
        for i, (a, b) in enumerate(zip(served, expected)):
            assert_same(a, b, f"{where}[{i}]")
    elif isinstance(expected, float):
        np.testing.assert_allclose(served, expected, atol=ATOL, rtol=0, err_msg=where)
    else:
        assert served == expected, f"{where}: {served!r} != {expected!r}"


@pytest.mark.parametrize("case", list(CASES))
def test_each_route_answers_as_the_pipeline(server, pipes, case):
    route, body, expected = CASES[case]

    response = httpx.post(f"{server.url}/{route}", json=body, timeout=60)

    assert response.status_code == 200, response.text
    assert_same(response.json(), json.loads(json.dumps(expected(pipes))), case)


def test_a_model_is_chosen_by_the_path_as_by_the_model_field(server, pipes):
    response = httpx.post(f"{server.url}/models/topics/predict", json={"inputs": TEXTS[0]}, timeout=60)

    assert_same(response.json(), pipes["topics"](TEXTS[0], top_k=None))


def test_tokenize_gives_the_tokenizers_ids_and_offsets(server, pipes):
    response = httpx.post(f"{server.url}/tokenize", json={"inputs": [TEXTS[0]], "model": "sentiment"}, timeout=60)

    tokens = response.json()[0]
    assert [t["id"] for t in tokens] == pipes["sentiment"].tokenizer(TEXTS[0])["input_ids"]
    assert [(t["text"], t["special"]) for t in tokens] == [("[CLS]", True), ("a", False), ("good", False),
                                                            ("film", False), ("[SEP]", True)]
    assert [TEXTS[0][t["start"]:t["stop"]] for t in tokens if not t["special"]] == ["a", "good", "film"]


def test_info_lists_every_model_with_its_task_and_routes(server, folders):
    info = httpx.get(f"{server.url}/info").json()

    assert [(m["model_id"], m["task"]) for m in info["models"]] == [
        ("sentiment", "text-classification"), ("topics", "text-classification"), ("ranker", "text-classification"),
        ("reward", "text-classification"), ("tagger", "token-classification"), ("reader", "question-answering"),
        ("chooser", "multiple-choice")]
    assert info["models"][2]["routes"] == ["/predict", "/tokenize", "/rerank", "/reward"]
    assert info["models"][6]["routes"] == ["/multiple_choice", "/tokenize"]
    assert all(m["max_input_length"] == MAX_POSITIONS for m in info["models"])
    assert all(len(m["devices"]) == 1 for m in info["models"])  # this process's one CPU device
    # Classifiers pack by default (their answers above are compared with the unpacked pipeline's).
    assert [m.get("packed_row_length") for m in info["models"]] == [MAX_POSITIONS] * 4 + [None] * 3


def test_multiple_choice_answers_the_numbers_flaxheads_predict_gives(server, folders, tmp_path):
    from flaxheads.tasks.choice.inference import predict_choices

    examples = [CHOICES[0], CHOICES[2]]  # a choice file holds one number of choices
    rows = tmp_path / "choices.jsonl"
    rows.write_text("".join(json.dumps(example) + "\n" for example in examples), encoding="utf-8")

    response = httpx.post(f"{server.url}/multiple_choice", json={"inputs": examples, "truncate": True}, timeout=60)

    predicted = predict_choices(folders["chooser"], rows, max_seq_length=MAX_POSITIONS)
    assert_same(response.json(), [{k: row[k] for k in ("label", "choice", "probabilities")} for row in predicted])


@pytest.mark.parametrize("example, words", [
    ({"context": "good", "choices": ["a"]}, "example 1's choices must be a list of two texts or more"),
    ({"context": "good", "choices": ["a", " "]}, "the text at index 1 of example 1's choices is blank"),
    ({"context": "good", "choices": ["a", "b"], "label": 0}, 'example 1 must be a dict {"context": ..., "choices"'),
    ({"choices": ["a", "b"]}, 'example 1 must be a dict {"context": ..., "choices"'),
])
def test_the_multiple_choice_pipeline_refuses_a_bad_example_naming_it(pipes, example, words):
    with pytest.raises(ValueError) as refused:
        pipes["chooser"]([CHOICES[0], example])

    assert words in str(refused.value)


def test_a_token_batch_is_cut_so_a_short_text_is_not_padded_to_a_long_ones_length(folders, pipes):
    (model,) = open_models([folders["tagger"]], max_batch_tokens=MAX_BATCH_TOKENS, warm=False)
    shapes, forward = [], model.pipe.scorer._forward
    model.pipe.scorer._forward = lambda params, ids, *rest: shapes.append(ids.shape) or forward(params, ids, *rest)

    answers = model.run(("simple", ("O",), None), [TEXTS[3], TEXTS[0]])  # 49 tokens and 5

    assert sorted(shapes) == [(1, 16), (1, 64)]  # not (2, 64): the short text in a pass of its own
    assert_same(answers, pipes["tagger"]([TEXTS[3], TEXTS[0]], aggregation_strategy="simple"))


def test_a_classifier_packs_short_inputs_several_to_a_row_and_pads_longer_ones_alone(folders, pipes, monkeypatch):
    monkeypatch.setattr(served_models, "PACKED_ROW_LENGTH", 16)  # TEXTS[3] (49 tokens) is then too long to pack
    # 32 tokens a pass: packed passes of 1 or 2 rows of 16, unpacked ones of 1 row (6 shapes to warm).
    (model,) = open_models([folders["sentiment"]], max_batch_tokens=32, warm=False)
    shapes = {"packed": [], "alone": []}

    def spied(seen, forward):
        return lambda params, ids, *rest: seen.append(ids.shape) or forward(params, ids, *rest)

    for kind, scorer in (("packed", model.packed_pipe.scorer), ("alone", model.pipe.scorer)):
        scorer._forward = spied(shapes[kind], scorer._forward)
    model.warm()
    warmed = {kind: set(seen) for kind, seen in shapes.items()}
    shapes["packed"].clear(), shapes["alone"].clear()

    answers = model.run(("default",), [(t, None) for t in TEXTS[::-1]])

    assert shapes == {"packed": [(2, 16)], "alone": [(1, 64)]}  # 3 texts of 5, 3 and 12 tokens in 2 rows
    assert all(set(seen) <= warmed[kind] for kind, seen in shapes.items()), (shapes, warmed)  # compiled ahead
    assert_same(answers, pipes["sentiment"](TEXTS[::-1], top_k=None))


async def _send(url: str, requests: list[tuple[str, dict]], concurrency: int) -> list[httpx.Response]:
    limit = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=len(requests))) as client:
        async def one(route, body):
            async with limit:
                return await client.post(f"{url}/{route}", json=body)
        return await asyncio.gather(*(one(route, body) for route, body in requests))


def test_concurrent_requests_of_mixed_lengths_and_tasks_each_get_their_own_answer(server, pipes):
    """Requests batched with others of any length (and beside other models' batches) are
    answered as the pipeline answers them alone."""
    rng = random.Random(0)
    names = [name for name in CASES if CASES[name][0] != "question_answering" or rng.random() < 0.5]
    chosen = [rng.choice(names) for _ in range(40)]

    responses = asyncio.run(_send(server.url, [CASES[name][:2] for name in chosen], concurrency=CAP))

    for i, (name, response) in enumerate(zip(chosen, responses)):
        assert response.status_code == 200, f"request {i} ({name}): {response.text}"
        assert_same(response.json(), json.loads(json.dumps(CASES[name][2](pipes))), f"request {i} ({name})")


def test_no_request_waits_for_a_compilation(server):
    """Every shape the routes above reached was compiled before the server listened (the tests
    before this one sent every route, task, length and batch size)."""
    metrics = httpx.get(f"{server.url}/metrics").text

    assert "\nflaxheads_compilations_total 0.0\n" in metrics, [line for line in metrics.splitlines()
                                                                 if line.startswith("flaxheads_compilations")]


BAD = {
    # name: (path, body: bytes or JSON, status, words the error must hold)
    "malformed_json": ("/predict", b'{"inputs": "a good', 400, "not valid JSON"),
    "body_not_an_object": ("/predict", [1, 2], 422, "not an object"),
    "inputs_missing": ("/predict", {"model": "sentiment"}, 422, "`inputs` is missing"),
    "inputs_of_wrong_type": ("/predict", {"inputs": 5, "model": "sentiment"}, 422, "`inputs` is the number 5"),
    "empty_string": ("/predict", {"inputs": "", "model": "sentiment"}, 422, "`inputs` is empty or blank"),
    "blank_text_in_batch": ("/predict", {"inputs": [["good"], [" \u200b"]], "model": "sentiment"}, 422,
                            "`inputs[1][0]` is empty or blank"),
    "three_strings": ("/predict", {"inputs": ["a", "b", "c"], "model": "sentiment"}, 422, '[["a"], ["b"], ...]'),
    "empty_batch": ("/predict", {"inputs": [], "model": "sentiment"}, 422, "`inputs` is an empty list"),
    "flag_not_a_boolean": ("/predict", {"inputs": "good", "model": "sentiment", "raw_scores": "yes"}, 422,
                           "`raw_scores` must be true or false"),
    "unknown_field": ("/predict", {"inputs": "good", "model": "sentiment", "top_k": 2}, 422,
                      "unknown field(s) 'top_k'"),
    "too_long_without_truncate": ("/predict", {"inputs": LONG, "model": "sentiment"}, 413, '"truncate": true'),
    "too_many_inputs": ("/predict", {"inputs": [["good"]] * 33, "model": "sentiment"}, 413,
                        "--max_client_batch_size"),
    "body_over_the_limit": ("/predict", {"inputs": "good " * 5000, "model": "sentiment"}, 413, "--payload_limit"),
    "unknown_model": ("/predict", {"inputs": "good", "model": "nobody"}, 404, "no served model is called 'nobody'"),
    "unknown_model_in_path": ("/models/nobody/predict", {"inputs": "good"}, 404, "'nobody'"),
    "several_models_answer": ("/predict", {"inputs": "good"}, 422, 'name one with the "model" field'),
    "model_without_the_route": ("/rerank", {"query": "a", "texts": ["b"], "model": "sentiment"}, 424,
                                "does not answer /rerank"),
    "thresholds_of_a_single_label_model": ("/predict", {"inputs": "good", "model": "sentiment",
                                                        "apply_thresholds": True}, 422, "`apply_thresholds`"),
    "lone_text_to_a_pair_model": ("/predict", {"inputs": "good", "model": "ranker"}, 422, "[text, text_pair]"),
    "rerank_texts_not_a_list": ("/rerank", {"query": "a", "texts": "b", "model": "ranker"}, 422,
                                "`texts` must be a list"),
    "token_text_too_long_without_stride": ("/token_classification", {"inputs": [LONG]}, 413, '"stride"'),
    "unknown_aggregation": ("/token_classification", {"inputs": "good", "aggregation_strategy": "best"}, 422,
                            "`aggregation_strategy` must be one of"),
    "question_without_context": ("/question_answering", {"inputs": {"question": "what ?"}}, 422,
                                 'exactly the fields "question" and "context"'),
    "top_k_below_one": ("/question_answering", {"inputs": QUESTIONS[0], "top_k": 0}, 422,
                        "`top_k` must be an integer of at least 1"),
    "choice_without_choices": ("/multiple_choice", {"inputs": {"context": "good"}}, 422,
                               'the fields "context" and "choices"'),
    "one_choice": ("/multiple_choice", {"inputs": [{"context": "good", "choices": ["a"]}]}, 422,
                   "`inputs[0].choices` must be a list of two texts or more"),
    "too_many_choices": ("/multiple_choice", {"inputs": {"context": "good", "choices": ["a"] * 33}}, 413,
                         "`inputs.choices` holds 33 choices"),
    "empty_choice": ("/multiple_choice", {"inputs": [CHOICES[0], {"context": "good", "choices": ["a", ""]}]}, 422,
                     "`inputs[1].choices[1]` is empty or blank"),
    "choice_too_long_without_truncate": ("/multiple_choice", {"inputs": CHOICES}, 413,
                                         '`inputs[2].choices[0]` has 124 tokens with its context'),
    "unknown_route": ("/embed", {"inputs": "good"}, 404, "no route /embed"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_request_is_a_4xx_json_error_naming_the_field_and_the_fix(server, case):
    path, body, status, words = BAD[case]
    content = body if isinstance(body, bytes) else json.dumps(body).encode()

    response = httpx.post(f"{server.url}{path}", content=content, headers={"Content-Type": "application/json"},
                          timeout=60)

    assert (response.status_code, response.json()["error_type"] != "") == (status, True), response.text
    assert words in response.json()["error"]


def test_the_server_answers_after_bad_requests_and_counts_them_by_kind(server):
    metrics = httpx.get(f"{server.url}/metrics").text
    response = httpx.post(f"{server.url}/predict", json={"inputs": "good", "model": "sentiment"}, timeout=60)

    assert response.status_code == 200
    assert 'flaxheads_errors_total{kind="validation"}' in metrics
    assert "flaxheads_batch_tokens_bucket" in metrics


def test_requests_beyond_the_cap_get_429_and_the_others_their_answers(server, pipes):
    body = {"inputs": [[t] for t in TEXTS] * 8, "model": "sentiment"}
    expected = json.loads(json.dumps(pipes["sentiment"](TEXTS * 8, top_k=None)))

    responses = asyncio.run(_send(server.url, [("predict", body)] * 64, concurrency=64))

    statuses = [response.status_code for response in responses]
    assert set(statuses) == {200, 429}, statuses
    assert responses[statuses.index(429)].json() == {"error": "Model is overloaded", "error_type": "overloaded"}
    for response in responses:
        if response.status_code == 200:
            assert_same(response.json(), expected)


def test_a_client_that_disconnects_mid_request_is_counted_and_costs_the_others_nothing(server):
    port = int(server.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as raw:  # half a body, then gone
        raw.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b"Content-Length: 100\r\n\r\n" + b'{"inputs": "a good')
    deadline, gone = time.monotonic() + 60, ""
    while time.monotonic() < deadline and not gone:
        gone = [line for line in httpx.get(f"{server.url}/metrics").text.splitlines()
                if line.startswith('flaxheads_errors_total{kind="client_gone"}')]
        time.sleep(0.2)

    assert gone == ['flaxheads_errors_total{kind="client_gone"} 1.0']
    assert httpx.post(f"{server.url}/predict", json={"inputs": "good", "model": "sentiment"}).status_code == 200


ON_TWO_DEVICES = """
import json, sys
import jax, numpy as np
from flaxheads.serving import open_models
shards = []  # (rows, rows on each device) of every batch array placed
real_put = jax.device_put
def spy(x, device=None, *args, **kwargs):
    if isinstance(x, np.ndarray) and isinstance(device, jax.sharding.NamedSharding):
        shards.append((x.shape[0], device.shard_shape(x.shape)[0]))
    return real_put(x, device, *args, **kwargs)
jax.device_put = spy
items = json.loads(sys.argv[1])
models = open_models(sys.argv[2:], max_batch_tokens=32, max_input_length=16, warm=False)
answers, placed = {}, {}
for m in models:
    del shards[:]
    answers[m.name] = [m.run(tuple(items[m.name][0]), batch) for batch in items[m.name][1]]
    placed[m.name] = list(shards)
print(json.dumps({"devices": [m.info()["devices"] for m in models], "shards": placed, "answers": answers}))
"""
TWO_DEVICE_ITEMS = {  # name: (the batch's key, batches), a model of each task
    "sentiment": (["default"], [[["a good film", None]], [["great", None], ["so dull", None], ["a film", None]]]),
    "tagger": (["simple", ["O"], None], [["a good film", "the plot was so dull", "great"]]),
    "reader": ([1, 15, None, False, True], [[["what was good ?", "the film was good"]]]),
    "chooser": (["default"], [[["the film was good", ["great", "bad", "so dull"]]]])}


def test_with_two_devices_a_forward_pass_splits_its_rows_between_them_and_answers_as_one(folders):
    """A server process with two (CPU) devices: every batch array of the forward passes is split
    row-wise over both (an odd number of rows padded to an even one), and the answers are those
    of one device."""
    from runs import cpu_devices_env

    names = list(TWO_DEVICE_ITEMS)
    done = subprocess.run([sys.executable, "-c", ON_TWO_DEVICES, json.dumps(TWO_DEVICE_ITEMS),
                           *(str(folders[name]) for name in names)], env=cpu_devices_env(2), capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    two = json.loads(done.stdout.splitlines()[-1])
    one = {m.name: [m.run(tuple(TWO_DEVICE_ITEMS[m.name][0]), batch) for batch in TWO_DEVICE_ITEMS[m.name][1]]
           for m in open_models([folders[name] for name in names], max_batch_tokens=32, max_input_length=16,
                                warm=False)}

    assert [len(devices) for devices in two["devices"]] == [2] * len(names)
    for name, shards in two["shards"].items():  # each task's forward pass
        assert shards and all(rows % 2 == 0 and on_each == rows // 2 for rows, on_each in shards), (name, shards)
    assert_same(two["answers"], json.loads(json.dumps(one)))


def test_an_untrained_or_incomplete_folder_is_refused_before_serving(folders, tmp_path):
    import torch
    import transformers

    from serve_models import _config, _tokenizer

    bare = tmp_path / "bare"
    torch.manual_seed(0)
    transformers.BertModel(_config()).save_pretrained(bare)
    _tokenizer(bare)
    incomplete = tmp_path / "incomplete"
    shutil.copytree(folders["sentiment"], incomplete)
    (incomplete / INCOMPLETE_MARKER).touch()

    with pytest.raises(UntrainedModel, match="Fine-tune it first"):
        open_models([bare], warm=False)
    with pytest.raises(CheckpointError, match="was being written when the writer stopped"):
        open_models([incomplete], warm=False)


def test_sigterm_lets_the_request_in_flight_finish_then_exits(server, pipes):
    """Runs last: it stops the module's server. The request's body is held back until after
    SIGTERM, so the request is in flight when the signal comes."""
    release, answer = threading.Event(), {}

    def body():
        yield b'{"model": "sentiment", '
        release.wait(60)
        yield json.dumps({"inputs": TEXTS[1]})[1:].encode()

    def post():
        answer["response"] = httpx.post(f"{server.url}/predict", content=body(), timeout=120,
                                        headers={"Content-Type": "application/json"})

    client = threading.Thread(target=post)
    client.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and "\nflaxheads_requests_in_flight 1.0" not in httpx.get(
            f"{server.url}/metrics").text:  # until the server reads the request's body
        time.sleep(0.1)
    server.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    release.set()
    client.join(120)
    code = server.wait(120)

    assert answer["response"].status_code == 200, answer["response"].text
    assert_same(answer["response"].json(), pipes["sentiment"](TEXTS[1], top_k=None))
    assert code == 0
