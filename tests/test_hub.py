"""resolve_checkpoint: local folders as they are, hub ids ("org/name") from huggingface_hub's
cache, offline. Nothing here reaches the network: the cache is built in tmp_path in the real
layout, and the one online path is a stand-in for snapshot_download that fails like an
unreachable hub."""

from __future__ import annotations

import shutil

import jax
import numpy as np
import pytest
from flax import nnx
from huggingface_hub.errors import LocalEntryNotFoundError

import flaxheads
from flaxheads.conversion.hub import resolve_checkpoint

COMMIT = "0123456789abcdef0123456789abcdef01234567"
OTHER_COMMIT = "fedcba9876543210fedcba9876543210fedcba98"


def cache_snapshot(cache, repo_id: str, source, commit: str = COMMIT, ref: str = "main"):
    """Puts the files of checkpoint folder `source` into `cache` as huggingface_hub does:
    blobs/, snapshots/<commit>/ (links to the blobs), refs/<ref> holding the commit."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir(exist_ok=True)
    for file in source.iterdir():
        blob = repo / "blobs" / f"{commit[:8]}-{file.name}"
        shutil.copy(file, blob)
        (snapshot / file.name).symlink_to(blob)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / ref).write_text(commit)  # no newline, as huggingface_hub writes it
    return snapshot


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)


def forbidden_download(repo_id, **kwargs):
    raise AssertionError(f"snapshot_download({repo_id!r}) called offline")


@pytest.fixture
def no_hub(monkeypatch):
    """Online, but snapshot_download fails as it does when the hub cannot be reached."""
    for variable in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(variable, raising=False)
    calls = []

    def unreachable(repo_id, **kwargs):
        calls.append(repo_id)
        raise LocalEntryNotFoundError("cannot reach the hub and no snapshot folder in the cache")

    monkeypatch.setattr("huggingface_hub.snapshot_download", unreachable)
    return calls


def test_an_existing_folder_is_returned_as_it_is(hf_checkpoint):
    path = hf_checkpoint("BertModel").path

    assert resolve_checkpoint(path) == path
    assert resolve_checkpoint(str(path)) == path


def test_a_cached_hub_id_resolves_offline_to_its_snapshot(hf_checkpoint, tmp_path, offline):
    snapshot = cache_snapshot(tmp_path / "hub", "org/tiny-bert", hf_checkpoint("BertModel").path)

    assert resolve_checkpoint("org/tiny-bert", cache_dir=tmp_path / "hub") == snapshot


def test_the_cache_comes_from_hf_hub_cache_when_no_cache_dir_is_given(hf_checkpoint, tmp_path, offline, monkeypatch):
    snapshot = cache_snapshot(tmp_path / "hub", "tiny-bert", hf_checkpoint("BertModel").path)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))

    assert resolve_checkpoint("tiny-bert") == snapshot


def test_a_revision_resolves_through_its_ref(hf_checkpoint, tmp_path, offline):
    cache = tmp_path / "hub"
    cache_snapshot(cache, "org/tiny-bert", hf_checkpoint("BertModel").path)
    tagged = cache_snapshot(cache, "org/tiny-bert", hf_checkpoint("BertModel").path, OTHER_COMMIT, ref="v1")

    assert resolve_checkpoint("org/tiny-bert", revision="v1", cache_dir=cache) == tagged
    assert resolve_checkpoint("org/tiny-bert", revision=OTHER_COMMIT, cache_dir=cache) == tagged


def test_a_model_loads_from_a_cached_hub_id_with_the_checkpoints_weights(hf_checkpoint, tmp_path, offline):
    source = hf_checkpoint("BertForSequenceClassification", num_labels=3).path
    cache_snapshot(tmp_path / "hub", "org/tiny-bert", source)

    cached = flaxheads.from_pretrained(resolve_checkpoint("org/tiny-bert", cache_dir=tmp_path / "hub"))

    expected = jax.tree.leaves(nnx.state(flaxheads.from_pretrained(source), nnx.Param))
    loaded = jax.tree.leaves(nnx.state(cached, nnx.Param))
    assert len(loaded) == len(expected) > 0
    for got, want in zip(loaded, expected):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_an_uncached_hub_id_offline_names_the_id_the_cache_and_the_way_out(tmp_path, offline, monkeypatch):
    monkeypatch.setattr("huggingface_hub.snapshot_download", forbidden_download)

    with pytest.raises(FileNotFoundError) as error:
        resolve_checkpoint("org/not-cached", cache_dir=tmp_path / "hub")

    message = str(error.value)
    assert "org/not-cached" in message and str(tmp_path / "hub" / "models--org--not-cached") in message
    assert "HF_HUB_OFFLINE=1 forbids downloading" in message and "pass its path" in message


def test_hf_hub_offline_wins_over_local_files_only_false(tmp_path, offline, monkeypatch):
    monkeypatch.setattr("huggingface_hub.snapshot_download", forbidden_download)

    with pytest.raises(FileNotFoundError, match="HF_HUB_OFFLINE"):
        resolve_checkpoint("org/not-cached", cache_dir=tmp_path / "hub", local_files_only=False)


def test_local_files_only_never_downloads(tmp_path, no_hub):
    with pytest.raises(FileNotFoundError, match="local_files_only=True forbids downloading"):
        resolve_checkpoint("org/not-cached", cache_dir=tmp_path / "hub", local_files_only=True)

    assert no_hub == []


def test_an_unreachable_hub_falls_back_to_the_cached_snapshot(hf_checkpoint, tmp_path, no_hub):
    snapshot = cache_snapshot(tmp_path / "hub", "org/tiny-bert", hf_checkpoint("BertModel").path)

    assert resolve_checkpoint("org/tiny-bert", cache_dir=tmp_path / "hub") == snapshot
    assert no_hub == ["org/tiny-bert"]


def test_an_unreachable_hub_without_a_cached_snapshot_says_so(tmp_path, no_hub):
    with pytest.raises(FileNotFoundError) as error:
        resolve_checkpoint("org/not-cached", cache_dir=tmp_path / "hub")

    message = str(error.value)
    assert "could not be reached" in message and "org/not-cached" in message and str(tmp_path / "hub") in message


@pytest.mark.parametrize("path", ["./typo", "../no/such/folder", "a/b/c"])
def test_a_missing_folder_that_is_no_hub_id_says_the_folder_does_not_exist(path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    with pytest.raises(FileNotFoundError, match=f"the folder {path} does not exist"):
        resolve_checkpoint(path)


def test_a_file_is_refused_naming_its_folder(hf_checkpoint):
    config = hf_checkpoint("BertModel").path / "config.json"

    with pytest.raises(NotADirectoryError, match="pass the checkpoint folder"):
        resolve_checkpoint(config)


def test_the_command_line_predicts_with_a_cached_hub_id(tmp_path, offline, monkeypatch, capsys):
    """`--model_name_or_path org/name` reaches the same cached snapshot as from_pretrained does:
    a trained classifier with its tokenizer, exported to a folder and cached under a hub id."""
    import transformers

    from flaxheads import cli
    from families import TINY_CONFIG

    config = transformers.BertConfig(num_hidden_layers=1, num_labels=2, **TINY_CONFIG)
    source = tmp_path / "source"
    transformers.BertForSequenceClassification(config).save_pretrained(source)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "good", "bad", "film"]
    (source / "vocab.txt").write_text("\n".join(vocab) + "\n")
    transformers.BertTokenizer(str(source / "vocab.txt")).save_pretrained(source)
    cache_snapshot(tmp_path / "hub", "org/tiny-classifier", source)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))

    assert cli.main(["predict", "--model_name_or_path", "org/tiny-classifier", "good film"]) == 0
    assert '"label"' in capsys.readouterr().out
