"""Where op-plugin finds the custom OPP kernels (fused_lce/backends/npu/env.py), against stand-in
libcust_opapi.so files built with g++: ASCEND_CUSTOM_OPP_PATH's order, $ASCEND_OPP_PATH/vendors/config.ini's
load_priority, the owner check, libraries that do not load, symbols split across builds, and the loader view
op-plugin fixed when torch_npu was imported (snapshotted after fused_lce, reconstructed before it)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from fused_lce.backends.npu import env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SYMS = ("aclnnFusedLceStatsCubeGetWorkspaceSize", "aclnnFusedLceStatsCube",
        "aclnnFusedLceGradCubeGetWorkspaceSize", "aclnnFusedLceGradCube")
CXX = shutil.which("g++")
pytestmark = pytest.mark.skipif(CXX is None, reason="needs g++ to build the stand-in libraries")


def make_vendor(folder, symbols=SYMS) -> str:
    """<folder>/op_api/lib/libcust_opapi.so exporting ``symbols`` (C linkage, as the generated aclnn API)."""
    lib = os.path.join(folder, "op_api", "lib")
    os.makedirs(lib, exist_ok=True)
    src = os.path.join(lib, "stub.cpp")
    with open(src, "w") as f:
        f.write("".join(f'extern "C" int {s}() {{ return 0; }}\n' for s in symbols) or "int unused;\n")
    subprocess.run([CXX, "-shared", "-fPIC", src, "-o", os.path.join(lib, env.CUST_LIB)], check=True)
    return os.path.realpath(os.path.join(lib, env.CUST_LIB))


def verdict(view_env, uid=None):
    return env._verdict(SYMS, env.loader_view(view_env), uid)


def test_custom_path_order_and_any_vendor_name(tmp_path):
    # op-plugin does not look at the folder name
    a = make_vendor(str(tmp_path / "a" / "vendors" / "customize"))
    b = make_vendor(str(tmp_path / "b" / "vendors" / "fused_lce"))
    custom = f"{tmp_path / 'a' / 'vendors' / 'customize'}:{tmp_path / 'b' / 'vendors' / 'fused_lce'}"
    assert verdict({"ASCEND_CUSTOM_OPP_PATH": custom}) == (a, None)
    # a missing folder and an empty entry are passed over
    assert verdict({"ASCEND_CUSTOM_OPP_PATH":
                    f"{tmp_path / 'nowhere'}::{tmp_path / 'b/vendors/fused_lce'}"}) == (b, None)
    lib, reason = verdict({})
    assert lib is None and "aclnnFusedLceStatsCubeGetWorkspaceSize" in reason and \
        "ASCEND_CUSTOM_OPP_PATH unset" in \
        reason


def test_symbols_split_across_two_builds_are_refused(tmp_path):
    old = make_vendor(str(tmp_path / "old"), SYMS[:2])  # an older package with the forward only
    new = make_vendor(str(tmp_path / "new"))
    lib, reason = verdict({"ASCEND_CUSTOM_OPP_PATH": f"{tmp_path / 'old'}:{tmp_path / 'new'}"})
    assert lib is None and "different libraries" in reason and old in reason and new in reason
    lib, reason = verdict({"ASCEND_CUSTOM_OPP_PATH": str(tmp_path / "old")})
    assert lib is None and reason.startswith("aclnn symbol(s) aclnnFusedLceGradCubeGetWorkspaceSize, ")
    assert f"{old} has no aclnnFusedLceGradCube" in reason


def test_vendors_folder_only_through_config_ini(tmp_path):
    opp = tmp_path / "opp"
    ours = make_vendor(str(opp / "vendors" / "fused_lce"))
    e = {"ASCEND_OPP_PATH": str(opp)}
    assert verdict(e)[0] is None  # no config.ini: op-plugin searches no vendor folder
    config = opp / "vendors" / "config.ini"
    config.write_text("load_priority=fused_lce\n")
    assert verdict(e) == (ours, None)
    # the first line counts
    config.write_text("# vendors\nload_priority=customize,fused_lce\nload_priority=other\n")
    assert verdict(e) == (ours, None)
    theirs = make_vendor(str(opp / "vendors" / "customize"))
    assert verdict(e) == (theirs, None)  # load order: customize first
    config.write_text("load_priority=other\n")
    lib, reason = verdict(e)
    assert lib is None and "config.ini load_priority=other" in reason
    config.write_text("load_priority=fused_lce\r\n")  # std::getline keeps the '\r': a vendor "fused_lce\r"
    assert verdict(e)[0] is None
    config.write_text("load_priority=fused_lce\n")
    both = {**e, "ASCEND_CUSTOM_OPP_PATH": str(opp / "vendors" / "customize")}
    assert verdict(both) == (theirs, None)  # ASCEND_CUSTOM_OPP_PATH before the vendors folder


def test_vendor_folder_missing_when_the_view_was_taken_is_never_searched(tmp_path):
    opp = tmp_path / "opp"
    (opp / "vendors").mkdir(parents=True)
    (opp / "vendors" / "config.ini").write_text("load_priority=fused_lce\n")
    view = env.loader_view({"ASCEND_OPP_PATH": str(opp)})  # op-plugin resolves the folder when it loads
    make_vendor(str(opp / "vendors" / "fused_lce"))
    assert env._verdict(SYMS, view, None)[0] is None
    assert env._verdict(SYMS, env.loader_view({"ASCEND_OPP_PATH": str(opp)}), None)[0] is not None


def test_owner_check(tmp_path):
    assert [env.owner_allows(owner, uid) for owner, uid in ((0, 0), (0, 1000), (1000, 1000), (1000, 0),
                                                            (1000, 1001))] == [True, True, True, False, False]
    lib = make_vendor(str(tmp_path / "v"))
    e = {"ASCEND_CUSTOM_OPP_PATH": str(tmp_path / "v")}
    assert verdict(e)[0] == lib  # this process's own library
    if os.getuid() != 0:
        return
    os.chown(lib, 1234, -1)  # a user's library, seen by root, by that user and by another user
    for uid, ok in ((0, False), (1234, True), (999, False)):
        got, reason = verdict(e, uid=uid)
        assert (got == lib) is ok, (uid, reason)
        assert ok or "skipped by op-plugin's owner check (owner uid 1234, this process " in reason


def test_library_that_does_not_load(tmp_path):
    lib = tmp_path / "v" / "op_api" / "lib"
    lib.mkdir(parents=True)
    (lib / env.CUST_LIB).write_text("not an ELF file")
    good = make_vendor(str(tmp_path / "w"))
    found, reason = verdict({"ASCEND_CUSTOM_OPP_PATH": str(tmp_path / "v")})
    assert found is None and "does not load" in reason
    assert verdict({"ASCEND_CUSTOM_OPP_PATH": f"{tmp_path / 'v'}:{tmp_path / 'w'}"}) == (good, None)


# -------------------------------------------------------------------------------------------- the loader view
PROBE = r"""
import json, os, sys
sys.path[:0] = [{fake!r}, {root!r}]
order = sys.argv[1]
# set inside the process: /proc/self/environ has the start value
os.environ["ASCEND_CUSTOM_OPP_PATH"] = sys.argv[2]
if order == "torch_npu_first":
    import torch_npu
import fused_lce
from fused_lce.backends.npu import env
if order == "fused_lce_first":
    import torch_npu  # the snapshot is taken here
os.environ["ASCEND_CUSTOM_OPP_PATH"] = sys.argv[3]  # too late for op-plugin
print("RESULT " + json.dumps(env.find_kernels({syms!r})))
"""


def _probe(tmp_path, order, at_import, later, start):
    script = tmp_path / "probe.py"
    script.write_text(PROBE.format(fake=os.path.join(ROOT, "tests", "support", "fake_torch_npu"), root=ROOT,
                                   syms=SYMS))
    e = {k: v for k, v in os.environ.items() if not k.startswith(("ASCEND_", "FUSED_LCE_"))}
    if start is not None:
        e["ASCEND_CUSTOM_OPP_PATH"] = start
    r = subprocess.run([sys.executable, str(script), order, at_import, later], env=e, capture_output=True,
                       text=True, timeout=300)
    line = next((x for x in r.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line is not None, r.stderr[-3000:]
    return json.loads(line[len("RESULT "):])


@pytest.mark.skipif(not os.path.exists("/proc/self/environ"), reason="needs /proc/self/environ")
def test_snapshot_when_fused_lce_comes_first_and_doubt_when_it_does_not(tmp_path):
    good = make_vendor(str(tmp_path / "good"))
    bad = str(tmp_path / "nothing")
    # fused_lce first: exactly what torch_npu's import saw, whatever the environment says later
    assert _probe(tmp_path, "fused_lce_first", str(tmp_path / "good"), bad, None) == [good, None]
    lib, reason = _probe(tmp_path, "fused_lce_first", bad, str(tmp_path / "good"), None)
    assert lib is None and "aclnnFusedLceStatsCube" in reason
    # torch_npu first, the variable changed inside the process: op-plugin may have read either value
    lib, reason = _probe(tmp_path, "torch_npu_first", str(tmp_path / "good"), str(tmp_path / "good"), bad)
    assert lib is None and "cannot tell which custom OPP library" in reason, reason
    assert "torch_npu was imported before fused_lce" in reason and "ASCEND_CUSTOM_OPP_PATH changed" in reason
    # torch_npu first, the variable as the process started with it: no doubt
    start = str(tmp_path / "good")
    assert _probe(tmp_path, "torch_npu_first", start, start, start) == [good, None]
