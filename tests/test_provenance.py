"""`muzero_jax.provenance`: the environment record a run directory keeps per start."""

import json
import shutil
import subprocess
import sys

import jax
import pytest

from muzero_jax import provenance


def test_record_names_this_process_packages_and_devices(tmp_path):
    record = provenance.append_environment_record(tmp_path, iteration=7, resumed=True)
    again = provenance.append_environment_record(tmp_path, iteration=9, resumed=False)
    lines = [json.loads(line) for line in (tmp_path / "environment.jsonl").read_text().splitlines()]
    assert lines == [record, again]  # appended, one JSON object per line
    assert (record["iteration"], record["resumed"]) == (7, True)
    assert record["python"] == "{}.{}.{}".format(*sys.version_info[:3])
    assert record["packages"]["jax"] == jax.__version__
    assert set(record["packages"]) == set(provenance.PACKAGES)
    assert record["devices"] == {"platform": jax.devices()[0].platform,
                                 "kind": jax.devices()[0].device_kind,
                                 "count": len(jax.devices()), "processes": 1}
    assert record["cpu"]["model"] and set(record["cpu"]["simd"]) <= set(provenance.SIMD_FLAGS)


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_git_commit_only_for_a_checkout_the_package_tops(tmp_path):
    def git(*args):
        return subprocess.run(["git", "-C", str(tmp_path), *args], check=True,
                              capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    (tmp_path / "muzero_jax").mkdir()
    (tmp_path / "muzero_jax" / "a.py").write_text("x = 1\n")
    nested = tmp_path / "venv" / "site-packages" / "muzero_jax"
    nested.mkdir(parents=True)
    git("add", "muzero_jax/a.py")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "c")
    head = git("rev-parse", "HEAD")
    assert provenance._git_commit(str(tmp_path / "muzero_jax")) == (head, False)
    (tmp_path / "muzero_jax" / "a.py").write_text("x = 2\n")
    assert provenance._git_commit(str(tmp_path / "muzero_jax")) == (head, True)
    # An installed copy inside someone else's repository is not that checkout.
    assert provenance._git_commit(str(nested)) == (None, None)
    assert provenance._git_commit(str(tmp_path.parent / "nowhere")) == (None, None)
