"""flaxheads.quiet_imports: third-party packages imported without torch or IPython where they
would load them for nothing flaxheads uses, each checked in a fresh process."""

import json
import subprocess
import sys

import pytest

from flaxheads import quiet_imports

TEXTS = ["A gripping, beautifully shot film.", "dull", "Ünïcödé and 1,234 numbers!"]


def _run(code: str) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr
    return result


def test_hidden_names_fail_to_import_inside_the_block_only(tmp_path, monkeypatch):
    (tmp_path / "fh_probe_module.py").write_text("VALUE = 7\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with quiet_imports.hidden("fh_probe_module", "json"):
        with pytest.raises(ImportError):
            import fh_probe_module  # noqa: F401
        import json as json_inside  # imported before the block: left as it is
    assert json_inside is json
    import fh_probe_module

    assert fh_probe_module.VALUE == 7
    monkeypatch.delitem(sys.modules, "fh_probe_module")


@pytest.mark.slow
def test_command_line_reads_the_tokenizer_without_torch(minilm_path):
    # What `cli.main` sets for the command line: the same tokenizer, encoding the same ids, with
    # torch never imported and no "PyTorch was not found" notice; torch imports as usual after.
    code = (
        "import json, os, sys\n"
        "from flaxheads import quiet_imports\n"
        "quiet_imports.use_torch_free_transformers()\n"
        "from flaxheads.tokenizer import read_tokenizer\n"
        f"tokenizer = read_tokenizer({str(minilm_path)!r})\n"
        f"ids = tokenizer({TEXTS!r}, truncation=True, max_length=12)['input_ids']\n"
        "torch_loaded = 'torch' in sys.modules\n"
        "import torch\n"
        "print(json.dumps({'torch_loaded': torch_loaded, 'ids': ids, 'class': type(tokenizer).__name__,\n"
        "                  'advisory': os.environ.get('TRANSFORMERS_NO_ADVISORY_WARNINGS'),\n"
        "                  'torch_after': torch.ones(2).sum().item()}))\n"
    )
    result = _run(code)
    got = json.loads(result.stdout.strip().splitlines()[-1])
    import transformers

    expected = transformers.AutoTokenizer.from_pretrained(str(minilm_path))
    assert got == {"torch_loaded": False, "ids": expected(TEXTS, truncation=True, max_length=12)["input_ids"],
                   "class": type(expected).__name__, "advisory": None, "torch_after": 2.0}
    assert "PyTorch was not found" not in result.stderr


@pytest.mark.slow
def test_a_library_caller_gets_transformers_with_torch(minilm_path):
    # Without the command line's setting, transformers finds torch as it always does.
    code = (
        "import sys\n"
        "from flaxheads.tokenizer import read_tokenizer\n"
        f"read_tokenizer({str(minilm_path)!r})\n"
        "from transformers.utils import import_utils\n"
        "print(import_utils.is_torch_available(), 'torch' in sys.modules)\n"
    )
    assert _run(code).stdout.split() == ["True", "True"]


@pytest.mark.slow
def test_transformers_that_looked_for_torch_is_left_to_import_it():
    # transformers remembers its first look for torch: once it has looked (and found it), hiding
    # torch would break its modules, so the setting is then ignored.
    code = (
        "import sys\n"
        "import transformers\n"
        "from flaxheads import quiet_imports\n"
        "quiet_imports.use_torch_free_transformers()\n"
        "quiet_imports.transformers().AutoTokenizer\n"
        "print('torch' in sys.modules)\n"
    )
    assert _run(code).stdout.strip() == "True"


def test_flax_is_imported_without_ipython():
    pytest.importorskip("IPython")  # installed here; the test says nothing where it is not
    code = (
        "import sys\n"
        "from flaxheads import quiet_imports\n"
        "quiet_imports.flax()\n"
        "from flax import nnx\n"
        "print('IPython' in sys.modules, nnx.Linear.__name__)\n"
    )
    assert _run(code).stdout.split() == ["False", "Linear"]
