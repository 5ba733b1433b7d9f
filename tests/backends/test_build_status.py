"""fused_lce/_build_status.json, what setup.py records per compiled part, as the providers read it."""
import json

from fused_lce.backends import build_status, cpp


def test_read_and_failure(tmp_path, monkeypatch):
    path = tmp_path / "_build_status.json"
    assert build_status.read(str(path)) == {"cpp": None, "npu_opp": None, "npu_adapter": None}  # never built
    path.write_text("not json")
    assert build_status.read(str(path))["cpp"] is None
    opp = {"ok": False, "attempted": True, "error": "k.cpp:1:2: error: boom", "log": "/b/build.log"}
    path.write_text(json.dumps({"cpp": {"ok": True, "attempted": True, "error": None, "log": None},
                                "npu_opp": opp, "npu_adapter": "garbage"}))
    got = build_status.read(str(path))
    assert got["npu_opp"] == opp and got["npu_adapter"] is None and got["cpp"]["ok"]
    assert build_status.failure(got["npu_opp"]) == "k.cpp:1:2: error: boom (full log: /b/build.log)"
    assert build_status.failure(got["cpp"]) is None and build_status.failure(None) is None


def test_cpp_reason_comes_from_the_record(tmp_path, monkeypatch):
    path = tmp_path / "_build_status.json"
    path.write_text(json.dumps({"cpp": {"ok": False, "attempted": False,
                                        "error": "not built: no C++ compiler (c++)", "log": None}}))
    monkeypatch.setattr(build_status, "PATH", str(path))
    assert cpp._missing_reason() == "not built: no C++ compiler (c++)"
    path.write_text(json.dumps({"cpp": {"ok": True, "attempted": True, "error": None, "log": None}}))
    monkeypatch.setattr(cpp, "_IMPORT_ERROR", "ImportError: undefined symbol: _ZN3c10")
    assert cpp._missing_reason() == "fused_lce._C failed to load (ImportError: undefined symbol: _ZN3c10)"
