"""`python -m sglang_snapmla.prepare` against a loopback stand-in of SGLang's server (a script serving /health,
/server_info and /generate): it starts the server with snapmla's backend, sends the requests that reach each prefill
path, stops the server and reports the cache folders; a server that fails a request or never starts ends it with
status 1 and the log's tail."""

import json
import os
import sys
import textwrap

import pytest

from sglang_snapmla import extend, prepare

STAND_IN = textwrap.dedent('''
    import json, os, signal, sys
    from http.server import BaseHTTPRequestHandler, HTTPServer
    port, record, fault = int(sys.argv[sys.argv.index("--port") + 1]), sys.argv[1], sys.argv[2]

    def stop(*_):
        print("stopped by SIGTERM", flush=True)
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    print("SnapMLA decode: sm_90a CUDA kernel, prebuilt library", flush=True)
    print("compiler folder:", os.environ.get("CUDA_HOME"), flush=True)
    if fault == "never-starts":
        sys.exit(3)

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def send(self, status, body):
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/server_info" and fault != "no-server-info":
                return self.send(200, {"max_req_input_len": 20000 if fault != "short" else 1000,
                                       "chunked_prefill_size": -1 if fault == "no-chunks" else 8192})
            self.send(200 if self.path == "/health" else 404, {})

        def do_POST(self):
            req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with open(record, "a") as f:
                f.write(json.dumps({"tokens": len(req["input_ids"]), "sampling": req["sampling_params"]}) + "\\n")
            if fault == "500" and len(req["input_ids"]) > 8192:
                return self.send(500, {"error": "internal"})
            if fault == "no-output":
                return self.send(200, {"meta_info": {}})
            self.send(200, {"output_ids": [1] * req["sampling_params"]["max_new_tokens"]})

    HTTPServer(("127.0.0.1", port), H).serve_forever()
''')


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    # the toolkit found through the nvcc on PATH, as on a build machine with CUDA_HOME unset
    for var in ("CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(var, raising=False)
    bin_dir = tmp_path / "build-machine" / "cuda" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "nvcc").write_text("#!/bin/sh\n")
    (bin_dir / "nvcc").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    script, record = tmp_path / "server.py", tmp_path / "requests.jsonl"
    script.write_text(STAND_IN)
    launched, real_command = [], prepare.server_command

    def use(fault="none"):
        def command(flags, port):
            launched.append(real_command(flags, port))
            return [sys.executable, str(script), str(record), fault, "--port", str(port)]

        monkeypatch.setattr(prepare, "server_command", command)
        return launched, record

    return use


def sampler_path(params: dict) -> str:
    """Which of SGLang 0.5.17's sampling paths (layers/sampler.py) one request alone takes: temperature 0 is top-k 1,
    all greedy is argmax; otherwise min-p, top-k or top-p go to FlashInfer's kernels, and the rest to torch."""
    if params.get("temperature", 1.0) < 1e-6 or params.get("top_k", -1) == 1:
        return "argmax"
    if params.get("min_p", 0.0) > 0:
        return "flashinfer min-p"
    if params.get("top_k", -1) not in (-1, 1 << 30) or params.get("top_p", 1.0) != 1.0:
        return "flashinfer top-k/top-p"
    return "torch multinomial"


def test_prepares_a_snapmla_server_through_every_prefill_path(stand_in, tmp_path, capsys, monkeypatch):
    launched, record = stand_in()
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    (tmp_path / "triton").mkdir()
    (tmp_path / "triton" / "kernel.cubin").write_bytes(b"x" * 2_000_000)
    code = prepare.main(["--model-path", "some/model", "--tp", "2", "--server-log", str(tmp_path / "server.log")])
    out = capsys.readouterr().out
    assert code == 0, out
    cmd = launched[0]
    assert cmd[cmd.index("--attention-backend") + 1] == "snapmla" and cmd[cmd.index("--tp") + 1] == "2"
    requests = [json.loads(line) for line in record.read_text().splitlines()]
    lengths = [r["tokens"] for r in requests]
    prefix = prepare.PREFIX_TOKENS
    assert lengths[:4] == [prefix, prefix + prepare.FEW_NEW, 2 * prefix, 8192 + 64]  # then the concurrent batch
    assert len(lengths) == 4 + prepare.BATCH + 1 + len(prepare.SAMPLED)
    # the sampler's paths: greedy (argmax), and FlashInfer's kernels for top-k / top-p and for min-p, which
    # FlashInfer builds with nvcc at first use -- a prepared image without them compiles at the first such request
    paths = {sampler_path(r["sampling"]) for r in requests}
    assert paths == {"argmax", "flashinfer top-k/top-p", "flashinfer min-p"}, paths
    # the two requests over the cached prefix take the two routes (SNAPMLA_EXTEND_ROUTE=auto), at every head count
    monkeypatch.delenv("SNAPMLA_EXTEND_ROUTE", raising=False)
    for heads in (8, 16, 32, 64, 128):
        assert extend.prefers_absorbed([prefix], [prepare.FEW_NEW], heads), heads
        assert not extend.prefers_absorbed([prefix], [prefix], heads), heads
    assert "stopped by SIGTERM" in (tmp_path / "server.log").read_text()  # stopped, not left to the 60 s kill
    assert "decode: SnapMLA decode: sm_90a CUDA kernel, prebuilt library" in out
    assert f"| Triton kernels | TRITON_CACHE_DIR | {tmp_path / 'triton'} | 2.0 |" in out
    # the compiler folder the caches are keyed on: given to the server, and named for the servers that use them
    home = tmp_path / "build-machine" / "cuda"
    assert f"compiler folder: {home}\n" in (tmp_path / "server.log").read_text()
    assert f"set CUDA_HOME={home} where the servers run" in out


def test_the_compiler_folder_is_found_as_flashinfer_finds_it(tmp_path, monkeypatch):
    """CUDA_HOME, then CUDA_PATH, then the folder above the nvcc on PATH (unresolved); none: the preparation stops
    at once, naming where it must run."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert prepare.compiler_home() is None
    with pytest.raises(SystemExit):
        prepare.main(["--model-path", "m"])
    (tmp_path / "toolkit-13" / "bin").mkdir(parents=True)
    nvcc = tmp_path / "toolkit-13" / "bin" / "nvcc"
    nvcc.write_text("#!/bin/sh\n")
    nvcc.chmod(0o755)
    (tmp_path / "toolkit").symlink_to(tmp_path / "toolkit-13")  # as /usr/local/cuda -> /usr/local/cuda-13.0
    monkeypatch.setenv("PATH", str(tmp_path / "toolkit" / "bin"))
    assert prepare.compiler_home() == str(tmp_path / "toolkit")
    monkeypatch.setenv("CUDA_PATH", "/b")
    assert prepare.compiler_home() == "/b"
    monkeypatch.setenv("CUDA_HOME", "/a")
    assert prepare.compiler_home() == "/a"


@pytest.mark.parametrize("fault,lengths", [("short", [496, 528, 992]), ("no-chunks", [2048, 2080, 4096]),
                                           ("no-server-info", [2044, 2076, 4088])])
def test_the_prompts_fit_the_server_it_started(stand_in, tmp_path, fault, lengths):
    """The prompts follow the server's /server_info: a 1 000-token input limit halves the prefix and sends nothing
    longer than it (not the 8 256 tokens that would cross a chunk); with chunked prefill off (-1) no prompt is sent as
    longer than a chunk; a server that does not answer /server_info is taken as 4 096 tokens without chunking. Every
    request fits, so the preparation succeeds."""
    _, record = stand_in(fault)
    assert prepare.main(["--model-path", "m", "--server-log", str(tmp_path / "server.log")]) == 0
    sent = [json.loads(line)["tokens"] for line in record.read_text().splitlines()]
    assert sent[:3] == lengths and len(sent) == 3 + prepare.BATCH + 1 + len(prepare.SAMPLED), sent


@pytest.mark.parametrize("fault,message", [("500", "HTTP Error 500"), ("never-starts", "exited with status 3"),
                                          ("no-output", "/generate answered without output")])
def test_a_server_that_fails_ends_it_with_the_log(stand_in, tmp_path, capsys, fault, message):
    stand_in(fault)
    # a server that exits ends the wait at once, not at the start-up timeout (bounded here, for a wait that would not)
    argv = ["--model-path", "m", "--server-log", str(tmp_path / "server.log"), "--startup-timeout", "60"]
    assert prepare.main(argv) == 1
    err = capsys.readouterr().err
    assert message in err and "SnapMLA decode:" in err  # the log's tail comes with the reason


def test_flags_it_owns_or_cannot_serve_are_refused(capsys):
    """In either spelling (`--flag value`, `--flag=value`): no model, a port of the user's, another backend, a flag
    without its value -- each stops with argparse's usage line naming it, before any server starts."""
    for argv, says in ((["--tp", "2"], "--model-path"), (["--model-path", "m", "--port", "3000"], "--port"),
                       (["--model-path=m", "--port=3000"], "--port"),
                       (["--model-path", "m", "--attention-backend", "flashmla"], "--attention-backend flashmla"),
                       (["--model-path=m", "--attention-backend=flashmla"], "--attention-backend flashmla"),
                       (["--model-path", "m", "--attention-backend"], "--attention-backend")):
        with pytest.raises(SystemExit) as stop:
            prepare.main(argv)
        assert stop.value.code == 2 and says in capsys.readouterr().err, argv


def test_the_model_path_in_either_spelling_reaches_the_server(stand_in, tmp_path, monkeypatch):
    launched, _ = stand_in()
    monkeypatch.setattr(prepare, "warm_requests", lambda port, max_prompt, chunk: [])
    for argv in (["--model-path=some/model"], ["--model-path", "some/model", "--attention-backend=snapmla"]):
        launched.clear()
        assert prepare.main([*argv, "--tp", "2", "--server-log", str(tmp_path / "server.log")]) == 0
        cmd = launched[0]
        assert cmd[cmd.index("--model-path") + 1] == "some/model" and cmd.count("--attention-backend") == 1, cmd
