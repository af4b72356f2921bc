"""`flaxheads.convert.convert` never damages its source or a folder that already holds a model:
it refuses overlapping folders and occupied destinations, and writes through a temporary folder."""

from __future__ import annotations

import os
import re
import shutil

import pytest

from flaxheads import convert as convert_module
from flaxheads.convert import convert


def snapshot(folder) -> dict[str, bytes]:
    """Every file under `folder` (relative name -> bytes), to show that nothing changed."""
    return {
        str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()
    }


def leftovers(parent) -> list[str]:
    """Temporary folders a conversion left behind in `parent`."""
    return [path.name for path in parent.iterdir() if ".tmp-" in path.name]


@pytest.fixture
def pretraining(hf_checkpoint, tmp_path):
    """A private copy of a BertForPreTraining folder (MLM and NSP heads: cls.* tensors) with a vocab."""
    src = tmp_path / "pretraining"
    shutil.copytree(hf_checkpoint("BertForPreTraining").path, src)
    (src / "vocab.txt").write_text("[PAD]\n[UNK]\n")
    return src


@pytest.fixture
def occupied(hf_checkpoint, tmp_path):
    """A folder holding another model (a 3-label classifier), the user's vocab and their notes."""
    dst = tmp_path / "occupied"
    shutil.copytree(hf_checkpoint("BertForSequenceClassification", num_labels=3).path, dst)
    (dst / "vocab.txt").write_text("the user's own vocabulary\n")
    (dst / "notes.md").write_text("my notes\n")
    return dst


@pytest.mark.parametrize("overwrite", [False, True])
def test_converting_a_folder_onto_itself_is_refused_and_leaves_it_intact(pretraining, overwrite):
    before = snapshot(pretraining)

    with pytest.raises(ValueError, match=r"dst .* is src .*would write into the checkpoint it reads"):
        convert(pretraining, pretraining, to="pytorch", overwrite=overwrite)

    assert snapshot(pretraining) == before
    assert leftovers(pretraining.parent) == []


def test_a_symlink_to_the_source_is_the_source(pretraining, tmp_path):
    link = tmp_path / "link"
    link.symlink_to(pretraining, target_is_directory=True)

    with pytest.raises(ValueError, match=r"is src"):
        convert(pretraining, link, to="pytorch", overwrite=True)


def test_a_dst_inside_src_is_refused(pretraining):
    with pytest.raises(ValueError, match=r"lies inside src"):
        convert(pretraining, pretraining / "converted", overwrite=True)

    assert not (pretraining / "converted").exists()


def test_a_dst_containing_src_is_refused(pretraining, tmp_path):
    with pytest.raises(ValueError, match=r"contains src"):
        convert(pretraining, tmp_path, overwrite=True)


@pytest.mark.parametrize("to", ["pytorch", "flaxheads"])
def test_a_dst_holding_another_model_is_refused_listing_its_files(hf_checkpoint, occupied, to):
    src = hf_checkpoint("BertForSequenceClassification", num_labels=3)
    if to == "flaxheads":
        (occupied / "flaxheads_model.safetensors").write_bytes(b"another model")
    before = snapshot(occupied)

    with pytest.raises(FileExistsError) as err:
        convert(src.path, occupied, to=to)

    assert "config.json" in str(err.value) and "vocab.txt" in str(err.value) and "model.safetensors" in str(err.value)
    assert "overwrite=True" in str(err.value)
    assert snapshot(occupied) == before
    assert leftovers(occupied.parent) == []


@pytest.mark.parametrize("name", ["vocab.txt", "pytorch_model.bin", "model-00001-of-00002.safetensors",
                                  "flax_model.msgpack", "model.safetensors.index.json"])
def test_any_checkpoint_file_in_dst_is_enough_to_refuse(hf_checkpoint, tmp_path, name):
    dst = tmp_path / "out"
    dst.mkdir()
    (dst / name).write_text("the user's")

    with pytest.raises(FileExistsError, match=re.escape(name)):
        convert(hf_checkpoint("BertModel").path, dst)

    assert os.listdir(dst) == [name]


def test_a_dst_with_only_other_files_is_converted_into_and_they_are_kept(hf_checkpoint, tmp_path):
    dst = tmp_path / "out"
    dst.mkdir()
    (dst / "README.md").write_text("mine\n")

    convert(hf_checkpoint("BertModel").path, dst)

    assert (dst / "README.md").read_text() == "mine\n"
    assert (dst / "flaxheads_model.safetensors").is_file() and (dst / "config.json").is_file()


def test_overwrite_replaces_only_the_files_the_conversion_writes(pretraining, occupied):
    convert(pretraining, occupied, to="pytorch", overwrite=True)

    assert (occupied / "vocab.txt").read_text() == "[PAD]\n[UNK]\n"
    assert (occupied / "notes.md").read_text() == "my notes\n"
    assert "BertForPreTraining" not in (occupied / "config.json").read_text()
    assert sorted(os.listdir(occupied)) == ["config.json", "model.safetensors", "notes.md", "vocab.txt"]
    assert leftovers(occupied.parent) == []


@pytest.mark.parametrize(("to", "stale"), [("pytorch", "flaxheads_model.safetensors"), ("flaxheads", "model.safetensors"),
                                           ("pytorch", "pytorch_model.bin"), ("pytorch", "tokenizer.json")])
def test_overwrite_refuses_a_file_it_would_leave_beside_the_new_weights(pretraining, occupied, to, stale):
    (occupied / stale).write_bytes(b"stale")
    before = snapshot(occupied)

    with pytest.raises(FileExistsError, match=rf"holds \['{re.escape(stale)}'\].*remove"):
        convert(pretraining, occupied, to=to, overwrite=True)

    assert snapshot(occupied) == before


def test_a_failed_conversion_leaves_dst_as_it_was_and_no_temporary_folder(pretraining, occupied, monkeypatch):
    before = snapshot(occupied)

    def fail(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(convert_module, "copy_tokenizer_files", fail)
    with pytest.raises(OSError, match="disk full"):
        convert(pretraining, occupied, to="pytorch", overwrite=True)

    assert snapshot(occupied) == before
    assert leftovers(occupied.parent) == []


def test_a_move_that_fails_halfway_puts_back_the_files_it_replaced(pretraining, occupied, monkeypatch):
    before = snapshot(occupied)
    replace = os.replace
    failed = []

    def replace_then_fail(source, target):
        # Moves go in name order: config.json is replaced and the old model.safetensors set aside
        # by the time the new one moves in.
        if target == occupied / "model.safetensors" and not failed:
            failed.append(source)
            raise OSError("interrupted")
        replace(source, target)

    monkeypatch.setattr(os, "replace", replace_then_fail)
    with pytest.raises(OSError, match="interrupted"):
        convert(pretraining, occupied, to="pytorch", overwrite=True)
    monkeypatch.undo()

    assert failed
    assert snapshot(occupied) == before
    assert leftovers(occupied.parent) == []


def test_a_failed_conversion_into_a_new_folder_creates_no_folder(pretraining, tmp_path, monkeypatch):
    def fail(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(convert_module, "copy_tokenizer_files", fail)
    with pytest.raises(OSError):
        convert(pretraining, tmp_path / "new" / "deeper" / "out", to="pytorch")

    assert not (tmp_path / "new").exists()


def test_a_new_dst_and_its_files_get_the_modes_of_any_new_folder_and_file(hf_checkpoint, tmp_path):
    mask = os.umask(0o022)
    try:
        convert(hf_checkpoint("BertModel").path, tmp_path / "out")
    finally:
        os.umask(mask)

    assert (tmp_path / "out").stat().st_mode & 0o777 == 0o755
    for name in ["config.json", "flaxheads_model.safetensors"]:
        assert (tmp_path / "out" / name).stat().st_mode & 0o777 == 0o644, name


@pytest.mark.slow
def test_a_conversion_killed_between_two_renames_leaves_a_folder_loaders_refuse(pretraining, occupied):
    """`convert --overwrite` moves its files in one by one; killed between two, the folder would
    pair a new config.json with old weights. The marker it holds meanwhile makes loaders refuse it."""
    import subprocess
    import sys

    import flaxheads

    script = (
        "import os, sys, pathlib\n"
        "from flaxheads.convert import convert\n"
        "out = pathlib.Path(sys.argv[2]).resolve()\n"
        "real = os.replace\n"
        "def replace(a, b):\n"
        "    real(a, b)\n"
        "    if pathlib.Path(b).parent == out and pathlib.Path(b).name == 'config.json':\n"
        "        os._exit(9)\n"
        "os.replace = replace\n"
        "convert(sys.argv[1], out, to='pytorch', num_labels=5, head='mean', overwrite=True)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script, str(pretraining), str(occupied)], capture_output=True, text=True)
    assert proc.returncode == 9, proc.stderr[-2000:]

    with pytest.raises(flaxheads.CheckpointError, match="was being written when the writer stopped"):
        flaxheads.from_pretrained(occupied)
    assert leftovers(occupied.parent)  # the killed writer's staging folder, whole weights in it
    convert(pretraining, occupied, to="pytorch", num_labels=5, head="mean", overwrite=True)  # done again, whole
    assert flaxheads.from_pretrained(occupied).config.num_labels == 5
    assert leftovers(occupied.parent) == []  # removed by the next write into the folder


def test_a_staging_folder_in_use_or_without_the_mark_is_never_removed_as_abandoned(tmp_path):
    from flaxheads import atomic

    dst = tmp_path / "out"
    foreign = tmp_path / ".out.tmp-mine"  # the user's, or an earlier version's: no mark
    foreign.mkdir()
    (foreign / "model.safetensors").write_bytes(b"weights")
    with atomic.staged_into(dst) as staging:
        (staging / "config.json").write_text("{}")
        in_use = [path for path in tmp_path.iterdir() if path.name.startswith(".out.tmp-") and path != foreign]

        assert len(in_use) == 1 and atomic.remove_abandoned(dst) == []

    assert (dst / "config.json").read_text() == "{}"
    assert not in_use[0].exists() and (foreign / "model.safetensors").read_bytes() == b"weights"
