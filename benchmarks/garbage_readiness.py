"""Figures for docs/reliability.md: one client sending what a model rejects, in a loop,
and the server's readiness meanwhile (issue 34).

    .venv/bin/python benchmarks/garbage_readiness.py [--requests 1000]

Starts `inferd serve` on examples/models/text_stats without its `text_inputs` parameter (so
the model itself raises on invalid UTF-8, rather than the server refusing it with 400) and
sends `--requests` binary requests of invalid UTF-8 one after another on one connection,
asking GET /v2/health/ready after each. Prints the answers by status, how many readiness
checks said 503, the readiness probes the server ran (inferd_readiness_probes_total) and a
valid request's answer afterwards.

The server gets free ports; the run stops with an error, and prints no figures, if that
server exits or another process answers on its port (tests/support/server_process.py). Needs
what `make serve` installs (the client is the standard library's http.client). The server's
log (one line per failed request) goes to a file, shown only when the run fails.
"""

from __future__ import annotations

import argparse
import http.client
import json
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.support.server_process import (  # noqa: E402
    check_port_free,
    check_still_serving,
    free_port,
    wait_until_serving,
)

BAD_UTF8 = b"\xff\xfe not text"


def text_model(repo: Path) -> None:
    shutil.copytree(ROOT / "examples" / "models" / "text_stats", repo / "text")
    config = repo / "text" / "config.pbtxt"
    text = config.read_text(encoding="utf-8").replace('"text_stats"', '"text"')
    config.write_text(
        "\n".join(line for line in text.splitlines() if "text_inputs" not in line) + "\n",
        encoding="utf-8",
    )


def answer(
    conn: http.client.HTTPConnection, method: str, path: str, body: bytes = b"", **headers: str
) -> tuple[int, bytes]:
    conn.request(method, path, body=body or None, headers=headers)
    response = conn.getresponse()
    return response.status, response.read()


def probes(metrics_port: int) -> dict[str, int]:
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=30) as response:
        text = response.read().decode()
    found = {"passed": 0, "failed": 0}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "inferd_readiness_probes_total" and s.labels.get("model") == "text":
                found[s.labels["result"]] = int(s.value)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1000)
    args = parser.parse_args()
    header = b'{"inputs":[{"name":"text","datatype":"BYTES","shape":[1,1],'
    header += b'"parameters":{"binary_data_size":%d}}]}' % (4 + len(BAD_UTF8))
    bad = header + len(BAD_UTF8).to_bytes(4, "little") + BAD_UTF8
    valid = json.dumps(
        {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1, 1], "data": ["hello"]}]}
    ).encode()
    with tempfile.TemporaryDirectory() as tmp:
        text_model(Path(tmp))
        port, metrics_port = free_port(), free_port()
        check_port_free(port)
        log = (Path(tmp) / "server.log").open("wb")  # each of the 500s is logged
        proc = subprocess.Popen(
            [sys.executable, "-m", "inferd", "serve", "--model-repository", tmp,
             "--http-port", str(port), "--grpc-port", "0",
             "--metrics-port", str(metrics_port), "--log-level", "WARNING"],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            wait_until_serving(proc.pid, port, exit_code=proc.poll)
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            answers: Counter[int] = Counter()
            unready = 0
            started = time.monotonic()
            for _ in range(args.requests):
                status, _ = answer(
                    conn,
                    "POST",
                    "/v2/models/text/infer",
                    bad,
                    **{"Inference-Header-Content-Length": str(len(header))},
                )
                answers[status] += 1
                unready += answer(conn, "GET", "/v2/health/ready")[0] != 200
            elapsed = time.monotonic() - started
            ran = probes(metrics_port)
            _, body = answer(conn, "POST", "/v2/models/text/infer", valid)
            upper = json.loads(body)["outputs"][0]["data"]
            check_still_serving(proc.pid, port, proc.poll)
        except BaseException:
            sys.stderr.write((Path(tmp) / "server.log").read_text(errors="replace")[-4000:])
            raise
        finally:
            proc.terminate()
            proc.wait(timeout=60)
            log.close()
    print(  # noqa: T201 (the figures)
        f"{args.requests} invalid requests in {elapsed:.1f} s: answers {dict(answers)}; "
        f"readiness 503 in {unready} of {args.requests} checks; probes {ran}; "
        f"then a valid request: {upper}"
    )


if __name__ == "__main__":
    main()
