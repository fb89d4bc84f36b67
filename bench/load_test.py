"""Bounded load test on loopback: N concurrent gradio_client sessions explaining at once.

    python bench/load_test.py                                   # 20 users, bloodmnist-vit (AHA T=0 + GradSkip)
    python bench/load_test.py --model bloodmnist-cnn --methods aha,gradcam
    python bench/load_test.py --tiny --users 5                  # tiny in-memory models (a smoke run)

The server runs in its own process (`app.build_app()` as `python app.py` builds it, on a free port); every
session is a separate gradio_client Client (its own session hash and state) that explains a different shipped
BloodMNIST cell as the Explain button does (the maps, then the chained curves event), then moves the GradSkip
alpha slider (two previews and a release), like a user would. Reports every
request's latency (p50/p95/max), failures, the wall time, and the server's peak resident memory (VmHWM of the
server process, read from /proc). Targets: every request succeeds, p95 <= 5 s, peak RSS <= 6 GB.
Writes bench/results/load_test.json (or --out).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CELLS = ROOT / "assets" / "bloodmnist"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


RESIDENT = []  # objects the server keeps alive for the memory measurement


def load_resident_sam() -> str:
    """Keep a SAM ViT-B resident with one image embedded (as after a Masks-tab click), for the memory figure.
    Real weights when cached; offline, the same architecture with random weights (same size in memory)."""
    import numpy as np
    from PIL import Image

    from explainers.masks import SamSegmenter, SamUnavailableError, load_sam

    try:
        segmenter, what = load_sam("vit_b"), "SAM ViT-B (hub weights)"
    except SamUnavailableError:
        from segment_anything import sam_model_registry

        segmenter, what = SamSegmenter(sam_model_registry["vit_b"](), label="SAM ViT-B"), \
            "SAM ViT-B architecture with random weights (the hub is unreachable here; same memory)"
    picture = np.asarray(Image.open(sorted(CELLS.glob("*.jpg"))[0]).convert("RGB").resize((256, 256)))
    RESIDENT.append(segmenter.prepare(picture))
    return what


def serve(port: int, tiny: bool, state_dir: str, heavy: int | None, sam: bool = False) -> None:
    """The server process."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import app

    if sam:
        print(f"[load_test] resident: {load_resident_sam()}", file=sys.stderr, flush=True)

    kwargs = {}
    if tiny:
        from conftest import tiny_cnn, tiny_vit

        from explainers.aha.network import AHAExplainer
        from explainers.aha.store import register_explainer
        from explainers.models import register_bundle

        for bundle in (register_bundle(tiny_cnn(num_classes=8)), register_bundle(tiny_vit(num_classes=8))):
            register_explainer(bundle, AHAExplainer(bundle))
        kwargs = {"model_names": ["tiny-vit", "tiny-cnn"], "default_model": "tiny-vit"}
    demo = app.build_app(state_dir=state_dir, data_dir=str(CELLS), heavy_concurrency=heavy, **kwargs)
    demo.queue(default_concurrency_limit=4).launch(server_name="127.0.0.1", server_port=port, quiet=True,
                                                   **app.launch_kwargs(demo))


def rss_mb(pid: int) -> tuple:
    """(current RSS, peak RSS) of a process and its children, in MB, from /proc."""
    def read(p):
        values = {}
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith(("VmRSS:", "VmHWM:")):
                    key, value = line.split(":")
                    values[key] = int(value.split()[0]) / 1024
        except OSError:
            pass
        return values
    main = read(pid)
    return main.get("VmRSS", 0.0), main.get("VmHWM", 0.0)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (its threads included), from /proc/PID/stat."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def percentile(values, q):
    ordered = sorted(values)
    if not ordered:
        return None
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


class RawClient:
    """A minimal client for Gradio's queue protocol (sse_v3): join, then read the session's event stream.

    gradio_client spends about as much CPU per request as the server does; on one 2-core machine that halves the
    server's share and measures the load generator. This speaks the same protocol as the browser: POST
    /gradio_api/queue/join {data, fn_index, session_hash}, then GET /gradio_api/queue/data?session_hash=... until
    `process_completed`; gr.State lives on the server under the session hash (sent as None, as the browser
    does); files go through /gradio_api/upload first. `predict(*args, api_name=...)` returns the outputs
    without the State ones, like gradio_client."""

    def __init__(self, url, config=None):
        import uuid

        import httpx

        self.url = url.rstrip("/")
        self.http = httpx.Client(timeout=None)
        self.config = config or self.http.get(f"{self.url}/config").json()
        self.prefix = self.url + self.config.get("api_prefix", "/gradio_api")
        self.types = {c["id"]: c["type"] for c in self.config["components"]}
        self.endpoints = {d["api_name"]: d for d in self.config["dependencies"] if d.get("api_name")}
        self.session_hash = uuid.uuid4().hex

    def upload(self, path) -> dict:
        with open(path, "rb") as handle:
            response = self.http.post(f"{self.prefix}/upload", files={"files": (Path(path).name, handle)})
        response.raise_for_status()
        return {"path": response.json()[0], "orig_name": Path(path).name, "meta": {"_type": "gradio.FileData"}}

    def predict(self, *args, api_name):
        dependency = self.endpoints[api_name.lstrip("/")]
        values = iter(args)
        data = [None if self.types[i] == "state" else next(values) for i in dependency["inputs"]]
        response = self.http.post(f"{self.prefix}/queue/join", json={
            "data": data, "fn_index": dependency["id"], "session_hash": self.session_hash, "event_data": None,
            "trigger_id": None})
        response.raise_for_status()
        event_id = response.json()["event_id"]
        with self.http.stream("GET", f"{self.prefix}/queue/data", params={"session_hash": self.session_hash}) as stream:
            for line in stream.iter_lines():
                if not line.startswith("data:"):
                    continue
                message = json.loads(line[5:])
                if message.get("event_id") != event_id or message.get("msg") != "process_completed":
                    continue
                output = message.get("output") or {}
                if not message.get("success"):
                    raise RuntimeError(output.get("error") or "the event failed")
                outputs = output.get("data", [])
                kept = [value for i, value in zip(dependency["outputs"], outputs) if self.types[i] != "state"]
                return kept[0] if len(kept) == 1 else tuple(kept)
        raise RuntimeError("the event stream closed before the result")


def session(url, index, model, methods, results, lock, barrier, alpha_moves, client_kind="raw", config=None):
    if client_kind == "gradio":
        from gradio_client import Client, handle_file
    else:
        Client = lambda url, verbose=False: RawClient(url, config)  # noqa: E731
        handle_file = None

    images = sorted(CELLS.glob("*.jpg"))
    image = images[index % len(images)]
    from saliency_lab.menus import sliders

    slider_defaults = [option.default for _, option in sliders()]  # every method slider, in the endpoint's order
    live_defaults = [option.default for _, option in sliders() if option.live]  # what /explain_curves takes
    try:
        for attempt in range(3):  # connecting is the load generator's business, not a measured request
            try:
                client = Client(url, verbose=False)
                break
            except Exception:  # noqa: BLE001
                if attempt == 2:
                    raise
                time.sleep(1.0)
        if handle_file is None:
            handle_file = client.upload  # uploads happen inside the measured explain call, as in a browser
        client.predict(model, methods, api_name="/select_model")
    except Exception as error:  # noqa: BLE001
        with lock:
            results.append({"session": index, "request": "connect", "ok": False, "seconds": None, "error": str(error)})
        barrier.wait()
        return
    barrier.wait()  # all sessions start explaining at the same moment
    # what the Explain button does: the maps (one event), then the curves (a chained event)
    calls = [("explain_maps", lambda: client.predict(handle_file(str(image)), model, methods, "auto",
                                                      *slider_defaults, 0.5, "cividis", 0,  # no outline
                                                      api_name="/explain_maps")),
             ("explain_curves", lambda: client.predict(*live_defaults, 0.5, "cividis", api_name="/explain_curves"))]
    if "gradskip" in methods:
        for alpha in alpha_moves:
            calls.append((f"alpha_preview {alpha}", lambda a=alpha: client.predict(a, 0.5, "cividis",
                                                                                  api_name="/alpha_preview")))
        calls.append(("alpha_curves", lambda: client.predict(alpha_moves[-1], 0.5, "cividis",
                                                             api_name="/alpha_curves")))
    session_start = time.perf_counter()
    for name, call in calls:
        started = time.perf_counter()
        record = {"session": index, "request": name}
        try:
            output = call()
            if name.startswith("explain"):
                overlays = output[2] if name == "explain_maps" else output[0]
                record["overlays"] = len(overlays)
                record["ok"] = len(overlays) == len(methods) and (
                    name == "explain_maps" or all(" ins " in o["caption"] for o in overlays))
                if not record["ok"]:
                    record["error"] = f"{len(overlays)} overlays for {len(methods)} methods: {str(output)[:300]}"
            else:
                record["ok"] = True
        except Exception as error:  # noqa: BLE001 - every failure is counted
            record["ok"] = False
            record["error"] = f"{type(error).__name__}: {str(error)[:300]}"
        record["seconds"] = time.perf_counter() - started
        record["since_start"] = time.perf_counter() - session_start
        with lock:
            results.append(record)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=20, help="concurrent gradio_client users")
    parser.add_argument("--model", default=None, help="default: bloodmnist-vit (tiny-vit with --tiny)")
    parser.add_argument("--methods", default="aha,gradskip")
    parser.add_argument("--tiny", action="store_true", help="tiny in-memory models (no weights needed)")
    parser.add_argument("--heavy-concurrency", type=int, default=None, help="the app's heavy concurrency limit")
    parser.add_argument("--alpha-moves", default="0.3,0.7", help="alpha values each session moves to")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "load_test.json"))
    parser.add_argument("--client", choices=("raw", "gradio"), default="raw",
                        help="raw: a minimal queue-protocol client (cheap); gradio: gradio_client (costs as much CPU "
                             "per request as the server, which matters when both share 2 cores)")
    parser.add_argument("--client-nice", type=int, default=10,
                        help="niceness of the client threads' process (0 = same priority as the server)")
    parser.add_argument("--sam", action="store_true", help="keep a SAM ViT-B resident in the server (one image "
                                                          "embedded) so the peak memory includes it")
    parser.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--state-dir", default=None, help=argparse.SUPPRESS)
    return parser


def summarise(results: list, args, model: str, methods: list, *, wall: float, server_cpu: float, client_cpu: float,
              idle_rss: float, peak_rss: float) -> dict:
    """The report: latencies per request kind (p50, p95, max), failures, CPU and memory of the server."""
    def stats(kind):
        values = [r["seconds"] for r in results if r["request"].startswith(kind) and r.get("seconds") is not None]
        return {"count": len(values), "p50_s": percentile(values, 50), "p95_s": percentile(values, 95),
                "max_s": max(values) if values else None}

    failures = [r for r in results if not r["ok"]]
    finished = [r["since_start"] for r in results if r["request"] == "explain_curves" and r.get("since_start")]
    complete = {"count": len(finished), "p50_s": percentile(finished, 50), "p95_s": percentile(finished, 95),
                "max_s": max(finished) if finished else None,
                "what": "from the click to the last curve: maps + curves, as a user waits"}
    all_seconds = [r["seconds"] for r in results if r.get("seconds") is not None]
    summary = {
        "model": model, "methods": methods, "sessions": args.users, "requests": len(results),
        "failures": len(failures), "failure_examples": failures[:5],
        "latency_all": {"p50_s": percentile(all_seconds, 50), "p95_s": percentile(all_seconds, 95),
                        "max_s": max(all_seconds) if all_seconds else None},
        "latency_explain_maps": stats("explain_maps"), "latency_explain_curves": stats("explain_curves"),
        "explain_complete": complete, "latency_alpha_preview": stats("alpha_preview"),
        "latency_alpha_curves": stats("alpha_curves"),
        "wall_s": wall, "server_cpu_s": server_cpu, "server_cpu_ms_per_request": 1000 * server_cpu / max(1, len(results)),
        "client_cpu_s": client_cpu, "server_rss_idle_mb": idle_rss, "server_rss_peak_mb": peak_rss,
        "targets": {"p95_s": 5.0, "peak_rss_gb": 6.0}, "sam_resident": args.sam, "client": args.client, "client_nice": args.client_nice,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "load_average_at_end": os.getloadavg() if hasattr(os, "getloadavg") else None},
    }
    return summary


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)

    if args.serve:
        serve(args.serve, args.tiny, args.state_dir, args.heavy_concurrency, args.sam)
        return 0

    import tempfile

    model = args.model or ("tiny-vit" if args.tiny else "bloodmnist-vit")
    methods = [m for m in args.methods.split(",") if m]
    alpha_moves = [float(a) for a in args.alpha_moves.split(",") if a]
    port = free_port()
    state_dir = tempfile.mkdtemp(prefix="saliency-load-")
    command = [sys.executable, __file__, "--serve", str(port), "--state-dir", state_dir]
    if args.tiny:
        command.append("--tiny")
    if args.heavy_concurrency:
        command += ["--heavy-concurrency", str(args.heavy_concurrency)]
    if args.sam:
        command.append("--sam")
    # the server imports app.py (and, with --tiny, the tests' tiny models) from the repository root
    paths = os.pathsep.join(filter(None, [str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH")]))
    server = subprocess.Popen(command, cwd=str(ROOT), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": paths})
    if args.client_nice:
        # the load generator is not the system under test: on a shared 2-core box, let the server have the CPU
        # first (real clients run on other machines)
        os.nice(args.client_nice)
    url = f"http://127.0.0.1:{port}/"
    try:
        import urllib.request

        deadline = time.monotonic() + 300
        while True:
            try:
                urllib.request.urlopen(url, timeout=2)
                break
            except Exception:  # noqa: BLE001 - not up yet
                if server.poll() is not None:
                    raise SystemExit(f"server exited: {server.stderr.read()[-2000:]}")
                if time.monotonic() > deadline:
                    raise SystemExit("server did not start within 300 s")
                time.sleep(0.5)
        idle_rss, _ = rss_mb(server.pid)
        results, lock = [], threading.Lock()
        barrier = threading.Barrier(args.users)
        peak = {"rss": 0.0}
        stop = threading.Event()

        def sample():
            while not stop.is_set():
                peak["rss"] = max(peak["rss"], rss_mb(server.pid)[0])
                time.sleep(0.05)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        config = None
        if args.client == "raw":
            import httpx

            config = httpx.get(url + "config").json()
        threads = [threading.Thread(target=session, args=(url, i, model, methods, results, lock, barrier, alpha_moves,
                                                          args.client, config))
                   for i in range(args.users)]
        server_cpu_before = cpu_seconds(server.pid)
        client_cpu_before = time.process_time()
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        wall = time.perf_counter() - started
        server_cpu = cpu_seconds(server.pid) - server_cpu_before
        client_cpu = time.process_time() - client_cpu_before
        stop.set()
        _, hwm = rss_mb(server.pid)
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()

    summary = summarise(results, args, model, methods, wall=wall, server_cpu=server_cpu, client_cpu=client_cpu,
                        idle_rss=idle_rss, peak_rss=max(hwm, peak["rss"]))
    summary["passed"] = (not summary["failures"] and (summary["latency_all"]["p95_s"] or 0) <= 5.0
                         and summary["server_rss_peak_mb"] <= 6144)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(summary, indent=2))
    print(json.dumps({k: summary[k] for k in ("model", "methods", "sessions", "requests", "failures", "latency_all",
                                              "latency_explain_maps", "latency_explain_curves", "explain_complete",
                                              "latency_alpha_preview", "latency_alpha_curves",
                                              "wall_s", "server_cpu_s", "server_cpu_ms_per_request", "client_cpu_s",
                                              "server_rss_peak_mb", "passed")}, indent=2))
    if summary["failures"]:
        print("failures:", json.dumps(summary["failure_examples"][:3], indent=2), file=sys.stderr)
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
