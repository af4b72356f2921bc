"""FSDP on every family: on 4 fake CPU devices the sharding rules split each parameter where 4
divides the dimension they split (kernels by input features, embeddings by rows) and no bias or
norm scale, the train step's state shardings follow the same rules, and the sharded model's
logits stay transformers'. One subprocess loads every family: the device count is fixed when jax
starts."""

from __future__ import annotations

import pytest

from families import FAMILIES, rows
from family_parity import FsdpJob, assert_close, fsdp_on_fake_devices, torch_logits

pytestmark = pytest.mark.slow  # a subprocess loading and compiling every family


def _checkpoint(hf_checkpoint, row):
    return hf_checkpoint(row.classifier, family=row.name, num_labels=3, **dict(row.fsdp.overrides))


@pytest.fixture(scope="module")
def sharded(hf_checkpoint) -> dict[str, dict]:
    """Row name -> what `fsdp_on_fake_devices` reports for the row's classifier."""
    sharded_rows = [row for row in FAMILIES.values() if row.fsdp is not None]
    jobs = [FsdpJob(_checkpoint(hf_checkpoint, row).path, row.batch(row.sample_padding), row.fsdp.layout,
                    dict(row.load_options)) for row in sharded_rows]
    return dict(zip((row.name for row in sharded_rows), fsdp_on_fake_devices(jobs)))


@pytest.mark.matrix()  # a third of the families a run (tests/conftest.py, MATRIX_PARTS)
@pytest.mark.parametrize("row", rows(having="fsdp"))
def test_fsdp_rules_split_the_parameters_on_four_fake_devices_and_keep_the_logits(hf_checkpoint, sharded, row):
    result, expected = sharded[row.name], row.fsdp
    assert "error" not in result, result.get("error")
    split = result["split"]

    assert result["tree"] == split  # the train step's state shardings follow the same rules
    assert expected.split <= split, sorted(expected.split - split)
    assert not expected.whole & split, sorted(expected.whole & split)
    for name, spec in expected.specs:
        assert result["specs"][name] == spec, name
    assert not any(name.endswith(("bias", "scale")) for name in split)
    batch = row.batch(row.sample_padding)
    assert_close(result["logits"], torch_logits(_checkpoint(hf_checkpoint, row).model, batch),
                 f"{row.name}: {row.fsdp.layout} on fake devices vs transformers")
