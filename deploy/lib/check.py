"""The offline checks of the deployment recipes (run by deploy/check).

1. Every YAML file under deploy/ parses, and every version the recipes and docs name
   is within the bounds in recipes.py (MIN_ENVOY, MIN_ENVOY_GATEWAY,
   LATEST_ENVOY_GATEWAY, MIN_ISTIO).
2. Each recipe (Envoy Gateway, Istio, plain Envoy + xDS) is rendered into the Envoy
   configuration it produces (see recipes.py) and must satisfy the invariants the
   filter needs: every Wasm filter has allow_on_headers_stop_iteration: true and
   failure_policy: FAIL_RELOAD and runs before the router; the public and the stats
   listener run the filter in one VM (same vm_config); the public listener's plugin
   config holds no push token and the stats listener's is `stats_only` with the token
   from Envoy's environment (`stats_token_env`, in host_env_keys), set from the Secret
   the collector reads; no recipe ships a token; the stats listener is loopback only;
   engine routes have timeout 0s and an idle timeout that is not 0 (Envoy Gateway
   sets 0 with `timeouts.request: 0s`, Istio disables the HCM's), the client-facing
   listener's buffer limit is above 1 MiB; every Secret the Envoy pods refer to is
   created by the docs' `kubectl -n NS create secret` in the pods' namespace; every
   worker's cluster exists and is what its route sends to; the collector's push URL and engine
   names agree with the plugin configs, and its readiness and liveness probes ask
   /healthz on its --listen port, listening beyond loopback. Every recipe runs
   llm-bridge beside its Envoy (bridge_problems), and every bridge has --fleet-key-file
   (never --insecure-no-fleet-key), one NATS authentication, tls:// URLs and
   --nats-ca, and reads its own Envoy's replicas endpoint with --token-file; on
   Kubernetes its files are on mounted Secrets (checked with the others) and its
   --replica differs per pod. deploy/nats (nats_problems): the server config requires
   TLS and a user the bridges name, its Deployment's Secrets and ConfigMap are created
   in its namespace, and the Kubernetes bridges connect to its Service.
3. The rendered configuration passes `envoy --mode validate` (which loads the .wasm
   and runs its on_configure, so the plugin config is checked by the filter too), and
   each plugin config passes `host-sim check-config`.
4. Live: each rendered configuration runs in a real Envoy in front of engine mocks
   (OS-chosen ports): requests are routed to the engine the filter chose and a
   conversation sticks; a 2 MiB prompt is routed (not 413); with a fresh token in
   Envoy's environment, llm-collector's push is accepted on the stats listener and a
   wrong token is refused there, the same push with the right token is not taken on
   the client-facing listener, and a chat request on the stats listener is a local
   404. Then nats-server runs deploy/nats/nats-server.conf (a private CA's certificate,
   OS-chosen ports) and the recipe's bridge (for xDS, llm-bridge.service's command
   line), with its own flags, joins it over TLS with
   the password and publishes what Envoy routes; without the password it is refused.
   The xDS example runs from its own files, and a new
   ecds.yaml is applied without a restart while a config the filter rejects is not.
5. The OCI image layout: built, verified, rebuilt to the same digest; with skopeo
   installed, `skopeo inspect` reads it; a corrupted blob, another .wasm and an
   artifact layer without the plugin.wasm title (`oras pull` would skip it) are refused.
6. Self-test: broken copies of the recipes (allow_on_headers_stop_iteration removed,
   FAIL_OPEN, no route timeout, the filter after the router, a token in the
   client-facing config, a shipped `change-me` Secret, Envoy's token from another
   Secret, the old listener name, a corrupted blob, collector probes missing or on
   loopback, the Envoy Gateway pods away from their Secrets, no idle timeout, a chart
   version that is not a release, a bridge without the fleet key, NATS authentication,
   TLS or its CA, the bridges' Secrets created elsewhere...) must each fail.
"""

import argparse
import copy
import hashlib
import http.client
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback

import yaml

import recipes
from recipes import RecipeError, hcms, plugin_config, plugin_config_text

DEPLOY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(DEPLOY)
WASM = os.path.join(ROOT, "target", "wasm32-wasip1", "wasm", "llm_router.wasm")
BIN = os.path.join(ROOT, "target", "debug")
ONE_MIB = 1 << 20


class CheckFailed(Exception):
    pass


# ---------------------------------------------------------------------------------
# Invariants on a rendered configuration


def _port_of(listener):
    return listener["address"]["socket_address"]["port_value"]


def _collector_flags(args):
    push, engines = None, []
    for a in args:
        if a.startswith("--push-url="):
            push = a.split("=", 1)[1]
        elif a.startswith("--engine="):
            engines.append(a.split("=", 1)[1].split("=", 1)[0])
    return push, engines


def invariants(r):
    """Problems with a rendered recipe, as sentences; empty when it is sound."""
    errs = []
    res = r.bootstrap["static_resources"]
    listeners = {li["name"]: li for li in res["listeners"]}
    clusters = {c["name"] for c in res["clusters"]}
    wasm = {}
    for lname, li in listeners.items():
        for h in hcms(li):
            filters = h.get("http_filters") or []
            names = [f.get("name") for f in filters]
            if not names or names[-1] != recipes.ROUTER_NAME:
                errs.append(f"listener {lname}: the router is not the last HTTP filter ({names})")
            for i, f in enumerate(filters):
                tc = f.get("typed_config") or {}
                if tc.get("@type") != recipes.WASM_TYPE:
                    continue
                cfg = tc.get("config") or {}
                where = f"listener {lname}, Wasm filter {f.get('name')}"
                if cfg.get("allow_on_headers_stop_iteration") is not True:
                    errs.append(f"{where}: allow_on_headers_stop_iteration is not true (the "
                                "body callback never runs and requests hang)")
                if cfg.get("failure_policy") != "FAIL_RELOAD":
                    errs.append(f"{where}: failure_policy is {cfg.get('failure_policy')}, not "
                                "FAIL_RELOAD (a crashed VM would fail every later request)")
                if recipes.ROUTER_NAME in names and i > names.index(recipes.ROUTER_NAME):
                    errs.append(f"{where}: runs after the router, so it never routes")
                wasm.setdefault(lname, []).append(tc)
    for needed in (r.public_listener, r.stats_listener):
        if needed not in listeners:
            errs.append(f"no listener {needed}")
        elif needed not in wasm:
            errs.append(f"listener {needed} runs no llm-router Wasm filter")
    if errs:
        return errs
    pub, st = wasm[r.public_listener][0], wasm[r.stats_listener][0]
    if pub["config"]["vm_config"].get("vm_id") != st["config"]["vm_config"].get("vm_id"):
        errs.append("the public and stats listeners' filters have different vm_ids: pushes "
                    "would not reach the router's shared data")
    elif pub["config"]["vm_config"] != st["config"]["vm_config"]:
        errs.append("the public and stats listeners' filters have different vm_configs: they "
                    "would run in different VMs, and pushes would not reach the router's data")
    stats_addr = listeners[r.stats_listener]["address"]["socket_address"]["address"]
    if stats_addr not in ("127.0.0.1", "::1"):
        errs.append(f"stats listener {r.stats_listener} binds {stats_addr}, not loopback")

    public = listeners[r.public_listener]
    hroutes = [(h, rt) for h in hcms(public) for vh in h["route_config"]["virtual_hosts"]
               for rt in vh.get("routes", []) if "route" in rt]
    routes = [rt for _, rt in hroutes]
    if not routes:
        errs.append(f"listener {r.public_listener} has no routes to engines")
    # Envoy's default; Envoy Gateway's renderer sets its own 32 KiB.
    conn_limit = public.get("per_connection_buffer_limit_bytes", ONE_MIB)
    if conn_limit <= ONE_MIB:
        errs.append(f"listener {r.public_listener}: per_connection_buffer_limit_bytes is "
                    f"{conn_limit} (at most 1 MiB): the filter reads the whole body before it "
                    "routes, so long prompts get 413. Raise the listener's limit (a route's "
                    "request_body_buffer_limit needs Envoy 1.36, and before 1.37 is not "
                    "applied when a filter stops at the headers)")
    for h, rt in hroutes:
        where = f"route {json.dumps(rt['match'])}"
        if rt["route"].get("timeout") != "0s":
            errs.append(f"{where}: timeout is {rt['route'].get('timeout', 'unset (15 s)')}, "
                        "not 0s: long generations would be cut")
        idle = rt["route"].get("idle_timeout")
        source = "the route's idle_timeout"
        if idle is None:
            idle, source = h.get("stream_idle_timeout"), "the HCM's stream_idle_timeout"
        if idle is not None and recipes.parse_duration(idle) == 0:
            errs.append(f"{where}: no idle timeout ({source} is {idle}): a frozen engine "
                        "would hold the request forever; give the stream an idle timeout "
                        "(the recipes use 120 s)")

    try:
        pc, spc = plugin_config(pub), plugin_config(st)
    except RecipeError as e:
        return errs + [str(e)]
    errs.extend(push_endpoint_problems(r, pc, spc, st["config"]["vm_config"]))
    header = pc.get("cluster_header", "x-llm-router-cluster")
    if pc.get("target", "cluster") != "cluster":
        errs.append("the recipes use target: cluster")
    for w in pc.get("workers", []):
        c = w.get("cluster", w["name"])
        if c not in clusters:
            errs.append(f"worker {w['name']}: cluster {c} does not exist")
        if r.route_style == "header_match":
            hits = [rt for rt in routes if rt["route"].get("cluster") == c and any(
                hm["name"] == header and hm.get("string_match", {}).get("exact") == c
                for hm in rt["match"].get("headers", []))]
            if not hits:
                errs.append(f"worker {w['name']}: no route sends `{header}: {c}` to cluster {c}")
    if r.route_style == "cluster_header" and not any(
            rt["route"].get("cluster_header") == header for rt in routes):
        errs.append(f"no route reads the cluster from {header}")
    if r.collector_args is not None:
        push, engines = _collector_flags(r.collector_args)
        m = re.fullmatch(r"http://(127\.0\.0\.1|localhost|\[::1\]):(\d+)(/.*)", push or "")
        if not m:
            errs.append(f"collector --push-url {push} is not a loopback http URL")
        else:
            if int(m.group(2)) != _port_of(listeners[r.stats_listener]):
                errs.append(f"collector pushes to port {m.group(2)}, the stats listener is on "
                            f"{_port_of(listeners[r.stats_listener])}")
            if m.group(3) != spc.get("stats_path", "/llm-router/stats"):
                errs.append(f"collector pushes to {m.group(3)}, the filter answers "
                            f"{spc.get('stats_path', '/llm-router/stats')}")
        names = sorted(w["name"] for w in pc.get("workers", []))
        if sorted(engines) != names:
            errs.append(f"collector engines {sorted(engines)} are not the workers {names}")
    if r.collector is not None:
        errs.extend(probe_problems(r.collector))
    errs.extend(secret_namespace_problems(r))
    errs.extend(bridge_problems(r, spc, _port_of(listeners[r.stats_listener])))
    return errs


# The bridge's NATS authentications: exactly one (--nats-user goes with
# --nats-password-file).
NATS_AUTH = ("--nats-creds", "--nats-nkey-file", "--nats-token-file", "--nats-user")


def bridge_problems(r, spc, stats_port):
    """Every recipe runs llm-bridge beside each Envoy, and every bridge locks the bus
    both ways: NATS's own authentication (one of --nats-creds, --nats-nkey-file,
    --nats-token-file, --nats-user with --nats-password-file) over TLS (tls:// URLs,
    --nats-ca), and the fleet key (--fleet-key-file; never --insecure-no-fleet-key).
    It reads its own Envoy's replicas endpoint, on the loopback stats listener, with
    the push token from a file; on Kubernetes every file it reads is on a mounted
    Secret or ConfigMap (the push token the collector's), and its --replica differs
    per pod."""
    if not r.bridges:
        return ["no llm-bridge beside the Envoys: the replicas do not share routing "
                "state (docs/src/replicas.md)"]
    errs = []
    path = (spc.get("replicas") or {}).get("path", "/llm-router/replicas")
    for b in r.bridges:
        f = recipes.flags(b.args)
        where = f"llm-bridge ({b.where})"
        if "--insecure-no-fleet-key" in f:
            errs.append(f"{where} runs with --insecure-no-fleet-key: anyone who can publish "
                        "on the bus can change every replica's routing")
        if "--fleet-key-file" not in f:
            errs.append(f"{where} has no --fleet-key-file: the fleet key is what makes "
                        "replicas refuse messages from outside the fleet")
        auth = [a for a in NATS_AUTH if a in f]
        if not auth:
            errs.append(f"{where} has no NATS authentication (--nats-creds, --nats-nkey-file, "
                        "--nats-token-file, or --nats-user with --nats-password-file): "
                        "the bus would admit anyone")
        elif len(auth) > 1:
            errs.append(f"{where} gives more than one NATS authentication ({', '.join(auth)}): "
                        "the bridge takes one")
        if "--nats-user" in f and "--nats-password-file" not in f:
            errs.append(f"{where}: --nats-user without --nats-password-file")
        urls = ",".join(v or "" for v in f.get("--nats", ["nats://127.0.0.1:4222"])).split(",")
        for u in urls:
            if not u.strip().startswith("tls://"):
                errs.append(f"{where}: --nats {u} is not a tls:// URL: the credentials and "
                            "every batch would cross the network in clear")
        if "--nats-ca" not in f:
            errs.append(f"{where} has no --nats-ca: nothing says which server certificate "
                        "to trust")
        want = f"http://127.0.0.1:{stats_port}{path}"
        got = (f.get("--envoy-url") or [None])[0]
        if got != want:
            errs.append(f"{where}: --envoy-url is {got}, not its own Envoy's replicas "
                        f"endpoint {want} (the loopback stats listener)")
        if "--token-file" not in f:
            errs.append(f"{where} has no --token-file: the replicas endpoint takes the push "
                        "token" + (" (not inline: --token shows in ps)" if "--token" in f else ""))
        if "--replica" not in f:
            errs.append(f"{where} has no --replica")
        if b.files is None:
            continue
        if not any("$(" in (v or "") for v in f.get("--replica", [])):
            errs.append(f"{where}: --replica is the same in every pod (take it from the pod "
                        "name, $(POD_NAME)): peers would refuse each other as own_replica")
        for file, src in sorted(b.files.items()):
            if src is None:
                errs.append(f"{where}: {file} is on no mounted Secret or ConfigMap")
        token = [b.files.get(v) for v in f.get("--token-file", [])]
        if token and token[0] and r.collector_secret and token[0][1:] != r.collector_secret:
            errs.append(f"{where}: --token-file is Secret {token[0][1]} key {token[0][2]}, "
                        f"Envoy's token Secret {r.collector_secret[0]} key "
                        f"{r.collector_secret[1]}: the replicas endpoint would answer 401")
    return errs


# Every `kubectl -n NS create secret TYPE NAME` the docs and recipes give.
CREATE_SECRET = re.compile(r"kubectl\s+-n\s+(\S+)\s+create\s+secret\s+\S+\s+([a-z0-9.-]+)")


def doc_texts():
    """{path relative to the repository: text} of the recipes and the docs that tell
    how to deploy them."""
    out = {}
    for dirpath, _, names in os.walk(DEPLOY):
        for n in names:
            path = os.path.join(dirpath, n)
            if n.endswith((".yaml", ".md", ".conf", ".service")) or os.path.dirname(path) == os.path.join(DEPLOY, "oci"):
                with open(path) as f:
                    out[os.path.relpath(path, ROOT)] = f.read()
    for rel in ("README.md", os.path.join("docs", "src", "deploy.md")):
        with open(os.path.join(ROOT, rel)) as f:
            out[rel] = f.read()
    return out


def created_secrets(texts):
    """{Secret: {namespaces the docs create it in}}."""
    out = {}
    for text in texts.values():
        for ns, name in CREATE_SECRET.findall(text):
            out.setdefault(name, set()).add(ns)
    return out


def secret_namespace_problems(r, texts=None):
    """Each Secret the Envoy pods refer to must be created, by the documented command,
    in the namespace where the pods run: a Secret is read from the pod's own
    namespace only, and a missing one keeps the pod in CreateContainerConfigError."""
    if r.pod_namespace is None:
        return []
    created = created_secrets(texts if texts is not None else doc_texts())
    errs = []
    for name, what in r.secret_refs:
        where = created.get(name)
        if not where:
            errs.append(f"Secret {name} ({what}): no documented `kubectl -n NS create "
                        "secret` makes it")
        elif r.pod_namespace not in where:
            errs.append(f"Secret {name} ({what}) is created in {', '.join(sorted(where))}, "
                        f"but the Envoy pods run in {r.pod_namespace}: it does not resolve "
                        "there and the pods stay in CreateContainerConfigError"
                        + (" (set provider.kubernetes.deploy.type: GatewayNamespace in "
                           "eg-values.yaml)" if r.name == "envoy-gateway" else ""))
    return errs


def nats_problems(texts=None):
    """deploy/nats: the server config requires a user and TLS, its user is the one the
    bridges name, the Kubernetes Deployment's Secrets and ConfigMap are created in its
    namespace, and the Kubernetes recipes' bridges connect to its Service."""
    errs = []
    texts = texts if texts is not None else doc_texts()
    conf = texts[os.path.join("deploy", "nats", "nats-server.conf")]
    body = "\n".join(line.split("#", 1)[0] for line in conf.splitlines())
    if not re.search(r"^\s*tls\s*\{[^}]*cert_file", body, re.M):
        errs.append("nats-server.conf has no tls block with a cert_file: the bus speaks clear "
                    "text")
    # nats-server reads a `$VAR` reference's value as a config value, not as text: a
    # generated password such as 1e5f... is read as a number and the server does
    # not start. Passwords generated with a letter first are always text.
    if re.search(r"password:\s*\$", body):
        for text in texts.values():
            for prefix in re.findall(r'--from-literal=password="([^"$]*)\$\(openssl rand', text):
                if not prefix[:1].isalpha():
                    errs.append("a NATS password is generated without a letter first "
                                f"(password=\"{prefix}$(openssl rand ...\"): nats-server reads "
                                "$NATS_BRIDGE_PASSWORD as a config value and does not start on "
                                "one like 1e5f... (read as a number)")
    users = re.findall(r"user:\s*([\w.-]+)", body)
    if not re.search(r"^\s*authorization\s*\{", body, re.M) or not users:
        errs.append("nats-server.conf has no authorization users: the bus admits anyone")
    docs = [d for d in yaml.safe_load_all(texts[os.path.join("deploy", "nats", "nats.yaml")]) if d]
    dep = next((d for d in docs if d.get("kind") == "Deployment"), None)
    svc = next((d for d in docs if d.get("kind") == "Service"), None)
    if dep is None or svc is None:
        return errs + ["deploy/nats/nats.yaml has no Deployment and Service"]
    ns = dep["metadata"]["namespace"]
    pod = dep["spec"]["template"]["spec"]
    created = created_secrets(texts)
    maps = {}
    for text in texts.values():
        for mns, name in re.findall(r"kubectl\s+-n\s+(\S+)\s+create\s+configmap\s+([a-z0-9.-]+)", text):
            maps.setdefault(name, set()).add(mns)
    for name, what in recipes.pod_secret_refs(pod["containers"], pod.get("volumes", [])):
        if ns not in created.get(name, set()):
            errs.append(f"NATS: Secret {name} ({what}) is not created in {ns} by a documented "
                        "`kubectl -n NS create secret`: the pod stays in "
                        "CreateContainerConfigError")
    for v in pod.get("volumes", []):
        if "configMap" in v and ns not in maps.get(v["configMap"]["name"], set()):
            errs.append(f"NATS: ConfigMap {v['configMap']['name']} is not created in {ns} by a "
                        "documented `kubectl -n NS create configmap`")
    host = f"{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc.cluster.local"
    ports = {p["port"] for p in svc["spec"]["ports"]}
    for name in ("envoy-gateway", "istio"):
        for b in render(name).bridges:
            f = recipes.flags(b.args)
            for v in f.get("--nats-user", []):
                if v not in users:
                    errs.append(f"{name}: the bridge's --nats-user {v} is not a user of "
                                f"nats-server.conf ({', '.join(users)})")
            for u in ",".join(v or "" for v in f.get("--nats", [])).split(","):
                m = re.fullmatch(r"tls://([^:/]+):(\d+)", u.strip())
                if not m or m.group(1) != host or int(m.group(2)) not in ports:
                    errs.append(f"{name}: the bridge connects to {u}, not the NATS Service "
                                f"tls://{host}:{min(ports)} of deploy/nats/nats.yaml")
    return errs


def version_problems(texts):
    """The version bounds, wherever the recipes and docs name a version: the Envoy
    Gateway chart exists and is within the bounds, an Envoy or Istio proxy image is not
    older than the minimum, and each "X or later" states the minimum."""
    errs = []
    lo, hi = recipes.MIN_ENVOY_GATEWAY, recipes.LATEST_ENVOY_GATEWAY
    for path, text in sorted(texts.items()):
        for v in re.findall(r"gateway-helm\s+--version\s+v(\d+\.\d+\.\d+)", text):
            t = tuple(int(x) for x in v.split("."))
            if t > hi:
                errs.append(f"{path}: Envoy Gateway chart v{v} is not a release (the latest is "
                            f"v{recipes.vstr(hi)})")
            elif t < lo:
                errs.append(f"{path}: Envoy Gateway v{v} is older than v{recipes.vstr(lo)}, the "
                            "oldest release the recipe works on")
        for v in re.findall(r"Envoy Gateway v(\d+\.\d+(?:\.\d+)?)(?:\+| or later)", text):
            if v != recipes.vstr(lo):
                errs.append(f"{path}: says Envoy Gateway v{v} or later; the bound is "
                            f"v{recipes.vstr(lo)}")
        for v in re.findall(r"Istio (\d+\.\d+(?:\.\d+)?) or later", text):
            if v != recipes.vstr(recipes.MIN_ISTIO):
                errs.append(f"{path}: says Istio {v} or later; the bound is "
                            f"{recipes.vstr(recipes.MIN_ISTIO)}")
        envoy_bounds = (re.findall(r"Envoy\**\s+\(?(1\.\d+) or later", text)
                        + re.findall(r"Envoy\**\s+\(?>= ?(1\.\d+)", text))
        for v in envoy_bounds:
            if v != recipes.vstr(recipes.MIN_ENVOY):
                errs.append(f"{path}: says Envoy {v} or later; the bound is "
                            f"{recipes.vstr(recipes.MIN_ENVOY)}")
        for a, b in re.findall(r"envoyproxy/envoy:[a-z-]*v?(\d+)\.(\d+)\.\d+", text):
            if (int(a), int(b)) < recipes.MIN_ENVOY:
                errs.append(f"{path}: Envoy image {a}.{b} is older than "
                            f"{recipes.vstr(recipes.MIN_ENVOY)}")
        for a, b in re.findall(r"istio/proxyv2:(\d+)\.(\d+)", text):
            if (int(a), int(b)) < recipes.MIN_ISTIO:
                errs.append(f"{path}: Istio proxy {a}.{b} is older than "
                            f"{recipes.vstr(recipes.MIN_ISTIO)}")
    return errs


def text_mutations():
    """(what, file, old, new, expected words): broken copies of the docs' versions and
    Secret commands, for version_problems and secret_namespace_problems."""
    values = os.path.join("deploy", "envoy-gateway", "eg-values.yaml")
    book = os.path.join("docs", "src", "deploy.md")
    return [
        ("a chart version that is not a release", values, "--version v1.9.0",
         "--version v1.10.0", "not a release"),
        ("Envoy Gateway v1.5.4 installed", values, "--version v1.9.0", "--version v1.5.4",
         "older than"),
        ("the book says Istio 1.27 or later", book, "Istio 1.28 or later",
         "Istio 1.27 or later", "the bound is 1.28"),
        ("the book says Envoy Gateway v1.5 or later", book, "Envoy Gateway v1.7.0 or later",
         "Envoy Gateway v1.5 or later", "the bound is v1.7.0"),
        ("the README says stock Envoy (1.34 or later", "README.md", "**stock Envoy** (1.35",
         "**stock Envoy** (1.34", "the bound is 1.35"),
        ("the xDS bootstrap says Envoy (>= 1.36)", os.path.join("deploy", "xds", "bootstrap.yaml"),
         "Envoy (>= 1.35)", "Envoy (>= 1.36)", "the bound is 1.35"),
        ("the fleet key's Secret created in another namespace", None,
         "kubectl -n llm create secret generic llm-fleet-key",
         "kubectl -n nats create secret generic llm-fleet-key", "CreateContainerConfigError"),
        ("the bridges' NATS password Secret never created", None,
         "kubectl -n llm create secret generic llm-bridge-nats",
         "kubectl -n llm create secret generic llm-bridge-nats-password",
         "CreateContainerConfigError"),
        ("the NATS server's TLS Secret created in another namespace", None,
         "kubectl -n llm create secret tls nats-server-tls",
         "kubectl -n nats create secret tls nats-server-tls", "CreateContainerConfigError"),
        ("nats-server.conf without tls", os.path.join("deploy", "nats", "nats-server.conf"),
         "tls {", "no_tls {", "clear text"),
        ("a NATS password generated as bare hex", None,
         'password="llm-$(openssl rand', 'password="$(openssl rand', "letter first"),
        ("nats-server.conf without authorization",
         os.path.join("deploy", "nats", "nats-server.conf"),
         "authorization {", "no_authorization {", "admits anyone"),
        ("the Secret created in envoy-gateway-system", None,
         "kubectl -n llm create secret generic llm-collector-token",
         "kubectl -n envoy-gateway-system create secret generic llm-collector-token",
         "CreateContainerConfigError"),
    ]


def push_endpoint_problems(r, pc, spc, vm_config):
    """The push endpoint only where it belongs: the client-facing listener's plugin
    config (`pc`) holds no token, so no push is answered there whatever the token; the
    stats listener's (`spc`) is `stats_only` and takes the token from Envoy's
    environment, which Kubernetes recipes fill from the Secret the collector reads. No
    recipe ships a token (a `change-me` is the token users keep)."""
    errs = []
    for field in ("stats_token", "stats_token_env"):
        if field in pc:
            errs.append(f"the client-facing listener's plugin config has `{field}`: the push "
                        "endpoint would answer there; only the stats listener's config may "
                        "hold the token")
    if pc.get("stats_only"):
        errs.append("the client-facing listener's plugin config is `stats_only`: it would "
                    "route nothing")
    if spc.get("stats_only") is not True:
        errs.append("the stats listener's plugin config is not `stats_only: true`: it would "
                    "route requests too")
    if "stats_token" in spc:
        errs.append(f"the stats listener's plugin config carries the token inline "
                    f"(stats_token: {spc['stats_token']!r}): take it from Envoy's environment "
                    "with `stats_token_env`, fed from a Secret or a file")
    var = spc.get("stats_token_env")
    if not var:
        errs.append("the stats listener's plugin config has no `stats_token_env`: no push "
                    "endpoint, the collector cannot feed the router")
    elif var not in ((vm_config.get("environment_variables") or {}).get("host_env_keys") or []):
        errs.append(f"the VM does not get {var} (vm_config.environment_variables."
                    "host_env_keys): the stats listener's config would be refused")
    if spc.get("workers") != pc.get("workers"):
        errs.append("the stats listener's plugin config lists other workers than the "
                    "router's: pushes naming the router's workers would be refused")
    if r.envoy_env is not None and var:
        src = r.envoy_env.get(var)
        if src is None:
            errs.append(f"Envoy's container does not set {var} from a Secret: the stats "
                        "listener's config would be refused")
        elif r.collector_secret is not None and src != r.collector_secret:
            errs.append(f"Envoy's {var} comes from Secret {src[0]} key {src[1]}, the "
                        f"collector's --token-file from Secret {r.collector_secret[0]} key "
                        f"{r.collector_secret[1]}: every push would get 401")
    for name, token in r.secrets.items():
        if token is not None:
            what = "`change-me`" if token == "change-me" else "an example token"
            errs.append(f"Secret {name} ships {what}, a token users keep: ship no Secret, "
                        "create it with a generated token (openssl rand -hex 32)")
    return errs


def probe_problems(container):
    """The collector's readiness and liveness probes must ask its own /healthz, on the
    port of its --listen, which must listen beyond loopback (the kubelet probes from
    outside the pod)."""
    listen = [a.split("=", 1)[1] for a in container.get("args", []) if a.startswith("--listen=")]
    if not listen:
        return ["the collector has no --listen: nothing answers its health probes"]
    host, _, port = listen[0].rpartition(":")
    errs = []
    if host in ("127.0.0.1", "localhost", "[::1]"):
        errs.append(f"collector --listen={listen[0]} is loopback: the kubelet's probes come "
                    "from outside the pod")
    for probe in ("readinessProbe", "livenessProbe"):
        get = (container.get(probe) or {}).get("httpGet") or {}
        if get.get("path") != "/healthz" or str(get.get("port")) != port:
            errs.append(f"collector {probe} is not GET /healthz on its --listen port {port}")
    return errs


# ---------------------------------------------------------------------------------
# Processes


class Procs:
    """Every process a check starts; all stopped on exit, pass or fail."""

    def __init__(self):
        self.procs = []

    def start(self, args, **kw):
        p = subprocess.Popen(args, **kw)
        self.procs.append(p)
        return p

    def stop(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
        for p in reversed(self.procs):
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs = []


def request(port, method, path, body=None, headers=None, timeout=10):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = json.dumps(body).encode() if isinstance(body, (dict, list)) else body
        h = {"content-type": "application/json"} if data is not None else {}
        # The checks read the router's decision headers: ask for them.
        h["x-llm-router-explain"] = "1"
        h.update(headers or {})
        conn.request(method, path, body=data, headers=h)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def wait_for(what, fn, timeout=20.0):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            v = fn()
            if v:
                return v
        except (OSError, http.client.HTTPException, ValueError) as e:
            last = e
        time.sleep(0.1)
    raise CheckFailed(f"timed out waiting for {what}" + (f" ({last})" if last else ""))


def start_engines(procs, names, tmp):
    ports = {}
    for name in names:
        p = procs.start([os.path.join(BIN, "engine-mock"), "--port", "0", "--worker-id", name],
                        stdout=subprocess.PIPE, stderr=open(os.path.join(tmp, f"engine-{name}.log"), "w"),
                        text=True)
        line = p.stdout.readline()
        m = re.search(r"listening on 127\.0\.0\.1:(\d+)", line)
        if not m:
            raise CheckFailed(f"engine mock {name} did not start: {line!r}")
        ports[name] = int(m.group(1))
    return ports


def start_envoy(procs, envoy, config_path, tmp, tag, env):
    """Envoy with `env` added to its environment (the push token, as the recipes hand
    it over)."""
    admin_path = os.path.join(tmp, f"{tag}.admin")
    log = open(os.path.join(tmp, f"{tag}.envoy.log"), "w")
    p = procs.start([envoy, "-c", config_path, "--admin-address-path", admin_path,
                     "--use-dynamic-base-id", "--concurrency", "1", "--log-level", "warning"],
                    stdout=log, stderr=subprocess.STDOUT, cwd=tmp, env=dict(os.environ, **env))

    def admin_port():
        if p.poll() is not None:
            raise CheckFailed(f"Envoy exited with {p.returncode}; see its log:\n"
                              + open(os.path.join(tmp, f"{tag}.envoy.log")).read()[-3000:])
        if os.path.exists(admin_path):
            text = open(admin_path).read().strip()
            if text:
                return int(text.rsplit(":", 1)[1])
        return None

    admin = wait_for("Envoy's admin address", admin_port)
    wait_for("Envoy to be ready", lambda: admin_port() and request(admin, "GET", "/ready")[0] == 200)
    return p, admin


def listener_ports(admin):
    _, _, body = request(admin, "GET", "/listeners?format=json")
    out = {}
    for s in json.loads(body)["listener_statuses"]:
        out[s["name"]] = s["local_address"]["socket_address"]["port_value"]
    return out


def counter(admin, name):
    _, _, body = request(admin, "GET", f"/stats?format=json&filter={re.escape(name)}$")
    total = 0
    for s in json.loads(body).get("stats", []):
        if s.get("name", "").endswith(name):
            total += s.get("value", 0) or 0
    return total


def chat(session, turn):
    system = f"You are assistant number {session}. " + "Follow the house rules carefully. " * 20
    messages = [{"role": "system", "content": system}]
    for t in range(turn + 1):
        messages.append({"role": "user", "content": f"session {session} question {t}: " +
                         "please explain the details at length " * 4})
        if t < turn:
            messages.append({"role": "assistant", "content": f"answer {t}: " +
                             "here is a long and careful answer " * 4})
    return {"model": "mock", "messages": messages}


def route_conversations(port, sessions=8):
    """Two turns of each conversation: each answered by the engine the filter chose,
    the second by the first's engine with a cache hit. Returns the workers used."""
    used = set()
    for s in range(sessions):
        owner = None
        for turn in range(2):
            status, h, body = request(port, "POST", "/v1/chat/completions", chat(s, turn))
            if status != 200:
                raise CheckFailed(f"session {s} turn {turn}: status {status}: {body[:300]!r}")
            worker, engine = h.get("x-llm-router-worker"), h.get("x-engine-worker")
            if worker is None or worker != engine:
                raise CheckFailed(f"session {s} turn {turn}: the filter chose {worker} but "
                                  f"engine {engine} answered")
            if turn == 0:
                owner = worker
            elif worker != owner or h.get("x-llm-router-decision") != "cache_hit":
                raise CheckFailed(f"session {s}: turn 1 went to {worker} "
                                  f"({h.get('x-llm-router-decision')}), turn 0 to {owner}")
            used.add(worker)
    return used


def long_prompt(port):
    """A 2 MiB prompt is routed, not refused with 413: the body buffer is raised where
    it applies while the filter holds the request at its headers."""
    body = chat(0, 0)
    body["messages"].append({"role": "user", "content": "x" * (2 * ONE_MIB)})
    status, h, resp = request(port, "POST", "/v1/chat/completions", body, timeout=60)
    if status != 200 or h.get("x-llm-router-worker") is None:
        raise CheckFailed(f"a 2 MiB prompt got {status} ({resp[:200]!r}): the body buffer "
                          "is not raised where the filter reads the body")
    return "a 2 MiB prompt routed"


def push_checks(procs, tmp, ports, stats_path, token, engines, admin):
    """The push endpoint only where it belongs: llm-collector's push with the token is
    accepted on the stats listener and a wrong token refused (401); on the client-facing
    listener the same push with the right token is not answered by the push endpoint
    (nothing accepted or refused there: it is just a request); a chat request on the
    stats listener is a local 404, routed nowhere."""
    public, stats = ports
    token_file = os.path.join(tmp, "collector-token")
    with open(token_file, "w") as f:
        f.write(token + "\n")
    args = [os.path.join(BIN, "llm-collector"), "--once",
            f"--push-url=http://127.0.0.1:{stats}{stats_path}", f"--token-file={token_file}"]
    args += [f"--engine={n}=http://127.0.0.1:{p}" for n, p in sorted(engines.items())]
    p = procs.start(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = p.communicate(timeout=30)
    if p.returncode != 0:
        raise CheckFailed(f"llm-collector --once failed: {err[-1000:]}")
    wait_for("the filter to count the collector's push as accepted",
             lambda: counter(admin, "llm_router_stats_pushes_accepted") >= 1)
    snapshot = json.loads(out)
    accepted = counter(admin, "llm_router_stats_pushes_accepted")
    rejected = counter(admin, "llm_router_stats_pushes_rejected")
    status, _, body = request(public, "POST", stats_path, snapshot,
                              {"authorization": f"Bearer {token}"})
    if status == 200 or counter(admin, "llm_router_stats_pushes_accepted") != accepted:
        raise CheckFailed(f"the client-facing listener took a push with the token ({status}: "
                          f"{body[:200]!r}): the push endpoint must answer on the stats "
                          "listener only")
    if counter(admin, "llm_router_stats_pushes_rejected") != rejected:
        raise CheckFailed("the client-facing listener's filter checked a push token: it has a "
                          "push endpoint")
    status, _, _ = request(stats, "POST", stats_path, snapshot,
                           {"authorization": "Bearer not-the-token"})
    if status != 401:
        raise CheckFailed(f"a push with a wrong token got {status}, not 401")
    status, h, _ = request(stats, "POST", "/v1/chat/completions", chat(0, 0))
    if status != 404 or "x-llm-router-worker" in h:
        raise CheckFailed(f"a chat request on the stats listener got {status} "
                          f"(worker {h.get('x-llm-router-worker')}), not a local 404")
    return ("push accepted on the stats listener only (client listener: not a push "
            "endpoint; wrong token: 401; chat on the stats listener: 404)")


def token_env(spc):
    """The stats config's token variable, with a fresh token for this run."""
    return {spc["stats_token_env"]: secrets.token_hex(32)}


def wasm_filters(doc):
    for li in doc["static_resources"]["listeners"]:
        for h in hcms(li):
            for f in h["http_filters"]:
                if f.get("typed_config", {}).get("@type") == recipes.WASM_TYPE:
                    yield li["name"], f["typed_config"]


def live_static(r, envoy, tmp):
    """Runs a rendered recipe in a real Envoy in front of engine mocks, with a fresh
    token in Envoy's environment as the recipe's Secret would put it there."""
    doc = copy.deepcopy(r.bootstrap)
    res = doc["static_resources"]
    pc = spc = None
    for lname, tc in wasm_filters(doc):
        value = tc["config"]["configuration"]
        if lname == r.public_listener:
            pc = json.loads(value["value"])
            # Seeded tie-breaks: the same requests always take the same workers.
            pc["rng_seed"] = 7
            value["value"] = json.dumps(pc)
        elif lname == r.stats_listener:
            spc = json.loads(value["value"])
    for li in res["listeners"]:
        li["address"]["socket_address"]["port_value"] = 0
    env = token_env(spc)
    procs = Procs()
    try:
        engines = start_engines(procs, [w["name"] for w in pc["workers"]], tmp)
        by_cluster = {w.get("cluster", w["name"]): engines[w["name"]] for w in pc["workers"]}
        for c in res["clusters"]:
            sa = c["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]
            sa["port_value"] = by_cluster[c["name"]]
        path = os.path.join(tmp, f"{r.name}.live.yaml")
        with open(path, "w") as f:
            yaml.safe_dump(doc, f, sort_keys=False)
        _, admin = start_envoy(procs, envoy, path, tmp, r.name, env)
        ports = listener_ports(admin)
        used = route_conversations(ports[r.public_listener])
        if len(used) < 2:
            raise CheckFailed(f"every conversation went to {used}: routing is not spreading")
        big = long_prompt(ports[r.public_listener])
        note = push_checks(procs, tmp, (ports[r.public_listener], ports[r.stats_listener]),
                           spc.get("stats_path", "/llm-router/stats"), next(iter(env.values())),
                           engines, admin)
        bridged = live_bridge(r, procs, tmp, (ports[r.public_listener], ports[r.stats_listener]),
                              next(iter(env.values())), admin)
        return f"{len(used)} workers used, conversations stick, {big}, {note}; {bridged}"
    finally:
        procs.stop()


def nats_server_bin():
    """nats-server as envoy/get-nats installs it (tests/run sets NATS_SERVER), or None."""
    if os.environ.get("NATS_SERVER"):
        return os.environ["NATS_SERVER"]
    return shutil.which("nats-server") or next(
        (p for p in ("/usr/sbin/nats-server", "/usr/local/sbin/nats-server") if os.path.isfile(p)),
        None)


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bridge_metric(port, series):
    status, _, body = request(port, "GET", "/metrics")
    if status != 200:
        raise ValueError(f"/metrics answered {status}")
    for line in body.decode().splitlines():
        if line.startswith(series + " "):
            return float(line.split()[1])
    raise ValueError(f"no {series}")


def start_nats(procs, tmp, tag):
    """deploy/nats/nats-server.conf as shipped, its certificate paths moved into `tmp`
    (a private CA signs a certificate for 127.0.0.1) and its port chosen by the OS;
    returns (port, CA file, the bridges' password)."""
    d = os.path.join(tmp, f"{tag}-nats")
    os.makedirs(d)
    run = lambda *a: subprocess.run(a, cwd=d, check=True, capture_output=True)
    run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        "-subj", "/CN=llm-nats-ca", "-keyout", "ca.key", "-out", "ca.pem")
    run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=nats",
        "-keyout", "tls.key", "-out", "tls.csr")
    with open(os.path.join(d, "ext"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    run("openssl", "x509", "-req", "-in", "tls.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "2", "-out", "tls.crt", "-extfile", "ext")
    port = free_port()
    with open(os.path.join(DEPLOY, "nats", "nats-server.conf")) as f:
        conf = f.read().replace("/etc/nats/tls/", d + "/")
    conf = re.sub(r"^port: \d+", f"port: {port}", conf, flags=re.M)
    conf = re.sub(r"^http_port: \d+", f"http_port: {free_port()}", conf, flags=re.M)
    with open(os.path.join(d, "nats-server.conf"), "w") as f:
        f.write(conf)
    # As the docs generate it: a letter first (see nats_problems).
    password = "llm-" + secrets.token_hex(32)
    procs.start([nats_server_bin(), "-c", os.path.join(d, "nats-server.conf")],
                stdout=subprocess.DEVNULL, stderr=open(os.path.join(d, "nats.log"), "w"),
                env=dict(os.environ, NATS_BRIDGE_PASSWORD=password))
    import socket
    wait_for("nats-server to listen", lambda: socket.create_connection(("127.0.0.1", port), 1).close() or True)
    return port, os.path.join(d, "ca.pem"), password


def live_bridge(r, procs, tmp, ports, token, admin):
    """The recipe's bridge, run as the recipe runs it beside this Envoy: its own flags,
    with the addresses and files moved to this run (its --envoy-url's path, its
    Secrets' contents generated here), against deploy/nats/nats-server.conf's server.
    It must join the bus (TLS with the CA, the password) and publish the inserts this
    Envoy routes; the same bridge without the password must stop (the bus admits no
    one else)."""
    if nats_server_bin() is None:
        return "bridge not run: no nats-server (envoy/get-nats installs it)"
    public, stats = ports
    nats_port, ca, password = start_nats(procs, tmp, r.name)
    d = os.path.join(tmp, f"{r.name}-bridge")
    os.makedirs(d)
    contents = {"--token-file": token, "--nats-password-file": password,
                "--fleet-key-file": secrets.token_urlsafe(32)}
    f = recipes.flags(r.bridges[0].args)
    args = [os.path.join(BIN, "llm-bridge")]
    for k, vs in f.items():
        for v in vs:
            if k == "--envoy-url":
                v = re.sub(r"^http://127\.0\.0\.1:\d+", f"http://127.0.0.1:{stats}", v)
            elif k == "--nats":
                v = f"tls://127.0.0.1:{nats_port}"
            elif k == "--nats-ca":
                v = ca
            elif k in contents:
                path = os.path.join(d, k.lstrip("-"))
                with open(path, "w") as fh:
                    fh.write(contents[k] + "\n")
                v = path
            elif k in recipes.BRIDGE_FILE_FLAGS:
                raise CheckFailed(f"the live check has no content for the bridge's {k}")
            elif k == "--replica":
                v = f"{r.name}-0"
            elif k == "--listen":
                continue
            args += [k] if v is None else [k, v]
    metrics = free_port()
    args += ["--listen", f"127.0.0.1:{metrics}"]
    log = os.path.join(d, "bridge.log")
    bridge = procs.start(args, stdout=subprocess.DEVNULL, stderr=open(log, "w"))
    wait_for("the bridge to join the bus", lambda: bridge_metric(metrics, "llm_bridge_bus_connected") == 1)
    before = bridge_metric(metrics, "llm_bridge_ops_published")
    for s in range(4):
        status, _, _ = request(public, "POST", "/v1/chat/completions", chat(300 + s, 0))
        if status != 200:
            raise CheckFailed(f"a request beside the bridge got {status}")
    wait_for("the bridge to publish this Envoy's inserts",
             lambda: bridge_metric(metrics, "llm_bridge_ops_published") > before)
    if bridge.poll() is not None:
        raise CheckFailed(f"the bridge exited: {open(log).read()[-1000:]}")
    # Without the password the server refuses it, and it stops saying so.
    bare = [a for i, a in enumerate(args) if a not in ("--nats-user", "--nats-password-file")
            and args[i - 1] not in ("--nats-user", "--nats-password-file")]
    bare[bare.index("--listen") + 1] = f"127.0.0.1:{free_port()}"
    bare[bare.index("--replica") + 1] = f"{r.name}-stranger"
    p = subprocess.run(bare, capture_output=True, text=True, timeout=30)
    if p.returncode == 0 or "authorization" not in (p.stdout + p.stderr).lower():
        raise CheckFailed(f"a bridge without the NATS password was not refused (exit "
                          f"{p.returncode}): {(p.stdout + p.stderr)[-500:]}")
    return ("its bridge joined nats-server.conf's bus over TLS with the password and "
            "published the routed inserts; without the password it was refused")


def live_xds(xds_dir, envoy, tmp):
    """Runs the xDS example from its own files, then updates ecds.yaml in place."""
    etc = os.path.join(tmp, "etc")
    os.makedirs(os.path.join(etc, "xds"))
    shutil.copy(WASM, os.path.join(etc, "plugin.wasm"))
    files = {}
    for name in recipes.XDS_FILES:
        with open(os.path.join(xds_dir, name + ".yaml")) as f:
            files[name] = yaml.safe_load(f.read().replace(recipes.XDS_PREFIX + "/", etc + "/"))
    by_name = {files[n]["resources"][0]["name"]: files[n]["resources"][0]["typed_config"]["config"]
               for n in recipes.ECDS_FILES}
    ecds_cfg = by_name["llm-router"]
    pc = json.loads(ecds_cfg["configuration"]["value"])
    pc["rng_seed"] = 7
    ecds_cfg["configuration"]["value"] = json.dumps(pc)
    spc = json.loads(by_name["llm-router-stats"]["configuration"]["value"])
    env = token_env(spc)
    for li in files["lds"]["resources"]:
        li["address"]["socket_address"]["port_value"] = 0
    files["bootstrap"]["admin"]["address"]["socket_address"]["port_value"] = 0
    procs = Procs()

    def write(name, doc):
        tmp_file = os.path.join(etc, f".{name}.yaml.new")
        with open(tmp_file, "w") as f:
            yaml.safe_dump(doc, f, sort_keys=False)
        os.replace(tmp_file, os.path.join(etc, "xds" if name != "bootstrap" else "", f"{name}.yaml"))

    def ecds_version(admin):
        _, _, body = request(admin, "GET", "/config_dump")
        for c in json.loads(body)["configs"]:
            if c.get("@type", "").endswith("EcdsConfigDump"):
                return {e.get("version_info") for e in c.get("ecds_filters", [])
                        if e.get("ecds_filter", {}).get("name") == "llm-router"}
        return set()

    try:
        engines = start_engines(procs, [w["name"] for w in pc["workers"]], tmp)
        by_cluster = {w.get("cluster", w["name"]): engines[w["name"]] for w in pc["workers"]}
        for c in files["cds"]["resources"]:
            c["type"] = "STATIC"
            sa = c["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]
            sa["address"], sa["port_value"] = "127.0.0.1", by_cluster[c["name"]]
        for name in ("lds", "cds", "ecds", "ecds-stats", "bootstrap"):
            write(name, files[name])
        envoy_proc, admin = start_envoy(procs, envoy, os.path.join(etc, "bootstrap.yaml"), tmp,
                                        "xds", env)
        ports = wait_for("both listeners from lds.yaml", lambda: (lambda p: p if len(p) == 2 else None)(
            listener_ports(admin)))
        public = next(n for n in ports if n != "llm_stats")
        used = route_conversations(ports[public])
        long_prompt(ports[public])
        push_checks(procs, tmp, (ports[public], ports["llm_stats"]),
                    spc.get("stats_path", "/llm-router/stats"), next(iter(env.values())), engines,
                    admin)
        bridged = live_bridge(recipes.render_xds(recipes.load_xds(xds_dir), WASM), procs, tmp,
                              (ports[public], ports["llm_stats"]), next(iter(env.values())),
                              admin)
        # A new plugin config through ECDS: applied in place, no restart.
        pc2 = dict(pc, policy="round_robin")
        ecds_cfg["configuration"]["value"] = json.dumps(pc2)
        files["ecds"]["version_info"] = "2"
        write("ecds", files["ecds"])
        wait_for("ecds.yaml version 2 to be applied", lambda: ecds_version(admin) == {"2"})
        seen = set()
        for s in range(8):
            status, h, _ = request(ports[public], "POST", "/v1/chat/completions", chat(100 + s, 0))
            if status != 200:
                raise CheckFailed(f"after the ECDS update: status {status}")
            seen.add(h.get("x-llm-router-worker"))
        if len(seen) != len(pc["workers"]):
            raise CheckFailed(f"after switching to round_robin, 8 requests went to {sorted(seen)}")
        # A config the filter refuses: rejected, the running one stays.
        pc3 = dict(pc, policy="no_such_policy")
        ecds_cfg["configuration"]["value"] = json.dumps(pc3)
        files["ecds"]["version_info"] = "3"
        write("ecds", files["ecds"])
        wait_for("Envoy to reject ecds.yaml version 3",
                 lambda: counter(admin, "extension_config_discovery.http_filter.llm-router.config_fail") >= 1
                 or counter(admin, "extension_config_discovery.llm-router.config_fail") >= 1)
        seen = set()
        for s in range(8):
            status, h, _ = request(ports[public], "POST", "/v1/chat/completions", chat(200 + s, 0))
            if status != 200:
                raise CheckFailed(f"after a rejected config: status {status}")
            seen.add(h.get("x-llm-router-worker"))
        if len(seen) != len(pc["workers"]):
            raise CheckFailed(f"after a rejected config, 8 requests went to {sorted(seen)}: "
                              "not version 2's round_robin")
        if envoy_proc.poll() is not None:
            raise CheckFailed("Envoy exited during the updates")
        return (f"{len(used)} workers used, push accepted on the stats listener only, ecds.yaml "
                "v2 applied live "
                "(round_robin over all workers), v3 with a bad policy rejected, v2 still serving; "
                + bridged.replace("its bridge", "llm-bridge.service's bridge"))
    finally:
        procs.stop()


# ---------------------------------------------------------------------------------
# Envoy and host-sim


# The push token's variable as the recipes name it, set for `envoy --mode validate` (the
# stats listener's plugin config is refused without it, as in production).
TOKEN_ENV = "LLM_ROUTER_STATS_TOKEN"


def envoy_validate(envoy, path):
    p = subprocess.run([envoy, "--mode", "validate", "-c", path, "--log-level", "error"],
                       capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, **{TOKEN_ENV: secrets.token_hex(32)}))
    if p.returncode != 0 or " OK" not in p.stdout + p.stderr:
        raise CheckFailed(f"envoy --mode validate -c {path} failed:\n{(p.stdout + p.stderr)[-3000:]}")


def host_sim_check(text, tmp, tag):
    """host-sim has no VM environment: a token variable becomes a literal token, the
    rest of the config is checked as it is."""
    pc = json.loads(text)
    if "stats_token_env" in pc:
        del pc["stats_token_env"]
        pc["stats_token"] = secrets.token_hex(32)
        text = json.dumps(pc)
    path = os.path.join(tmp, f"{tag}.plugin.json")
    with open(path, "w") as f:
        f.write(text)
    p = subprocess.run([os.path.join(BIN, "host-sim"), "check-config", "--wasm", WASM, path],
                       capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        raise CheckFailed(f"host-sim check-config ({tag}) refused the plugin config:\n"
                          f"{(p.stdout + p.stderr)[-2000:]}")


def plugin_texts(r):
    seen = []
    for li in r.bootstrap["static_resources"]["listeners"]:
        for h in hcms(li):
            for f in h["http_filters"]:
                tc = f.get("typed_config") or {}
                if tc.get("@type") == recipes.WASM_TYPE:
                    t = plugin_config_text(tc)
                    if t not in seen:
                        seen.append(t)
    return seen


# ---------------------------------------------------------------------------------
# The recipes


def render(name, docs=None):
    d = os.path.join(DEPLOY, name)
    if name == "envoy-gateway":
        return recipes.render_envoy_gateway(docs or recipes.load_docs(d), WASM)
    if name == "istio":
        return recipes.render_istio(docs or recipes.load_docs(d), WASM)
    return recipes.render_xds(docs or recipes.load_xds(d), WASM)


RECIPES = ["envoy-gateway", "istio", "xds"]


def find(docs, kind):
    return next(d for _, d in docs if d.get("kind") == kind)


def _eg_filter(docs):
    return find(docs, "EnvoyPatchPolicy")["spec"]["jsonPatches"][0]["operation"]


def _istio_ext(docs):
    return find(docs, "EnvoyFilter")["spec"]["configPatches"][0]["patch"]["value"]["typed_config"]["config"]


def mutations():
    """(recipe, what, mutate(docs), expected words in the failure)."""
    def eg_no_allow(d):
        _eg_filter(d)["value"]["typed_config"]["config"].pop("allow_on_headers_stop_iteration", None)

    def eg_fail_open(d):
        _eg_filter(d)["value"]["typed_config"]["config"]["failure_policy"] = "FAIL_OPEN"

    def eg_no_timeout(d):
        del find(d, "HTTPRoute")["spec"]["rules"][0]["timeouts"]

    def eg_after_router(d):
        _eg_filter(d)["path"] = "/default_filter_chain/filters/0/typed_config/http_filters/-"

    def eg_old_name(d):
        find(d, "EnvoyPatchPolicy")["spec"]["jsonPatches"][0]["name"] = "llm/llm-gateway/http"

    def eg_no_buffer(d):
        del find(d, "ClientTrafficPolicy")["spec"]["connection"]

    def eg_rules_reordered(d):
        rules = find(d, "HTTPRoute")["spec"]["rules"]
        rules[0], rules[1] = rules[1], rules[0]

    def eg_old_envoy(d):
        dep = find(d, "EnvoyProxy")["spec"]["provider"]["kubernetes"]["envoyDeployment"]
        dep["container"]["image"] = "docker.io/envoyproxy/envoy:distroless-v1.34.1"

    def istio_no_allow(d):
        _istio_ext(d).pop("allow_on_headers_stop_iteration", None)

    def istio_after_router(d):
        patch = next(cp for cp in find(d, "EnvoyFilter")["spec"]["configPatches"]
                     if cp["applyTo"] == "HTTP_FILTER")
        patch["patch"]["operation"] = "INSERT_AFTER"

    def istio_token_elsewhere(d):
        pod = find(d, "Deployment")["spec"]["template"]["spec"]
        proxy = recipes.container_named(pod["containers"], "istio-proxy")
        proxy["env"][0]["valueFrom"]["secretKeyRef"]["name"] = "something-else"

    def istio_change_me(d):
        d.append(("gateway.yaml", {"apiVersion": "v1", "kind": "Secret", "metadata": {
            "name": "llm-collector-token", "namespace": "llm"}, "stringData": {"token": "change-me"}}))

    def eg_public_token(d):
        cfg = _eg_filter(d)["value"]["typed_config"]["config"]["configuration"]
        cfg["value"] = json.dumps(dict(json.loads(cfg["value"]), stats_token="change-me"))

    def eg_no_env(d):
        dep = find(d, "EnvoyProxy")["spec"]["provider"]["kubernetes"]["envoyDeployment"]
        del dep["container"]["env"]

    def _xds_stats(d):
        return d["ecds-stats"]["resources"][0]["typed_config"]["config"]["configuration"]

    def xds_stats_routes(d):
        cfg = _xds_stats(d)
        pc = json.loads(cfg["value"])
        del pc["stats_only"]
        cfg["value"] = json.dumps(pc)

    def xds_inline_token(d):
        cfg = _xds_stats(d)
        pc = json.loads(cfg["value"])
        del pc["stats_token_env"]
        cfg["value"] = json.dumps(dict(pc, stats_token="change-me"))

    def istio_push_port(d):
        dep = find(d, "Deployment")
        c = recipes.collector_container(dep["spec"]["template"]["spec"]["containers"])
        c["args"][0] = "--push-url=http://127.0.0.1:10002/llm-router/stats"

    def istio_no_readiness(d):
        dep = find(d, "Deployment")
        c = recipes.collector_container(dep["spec"]["template"]["spec"]["containers"])
        del c["readinessProbe"]

    def eg_probe_loopback(d):
        dep = find(d, "EnvoyProxy")["spec"]["provider"]["kubernetes"]["envoyDeployment"]
        containers = dep["patch"]["value"]["spec"]["template"]["spec"]["containers"]
        c = recipes.collector_container(containers)
        c["args"] = [a.replace("0.0.0.0:9102", "127.0.0.1:9102") for a in c["args"]]

    def xds_no_allow(d):
        d["ecds"]["resources"][0]["typed_config"]["config"].pop("allow_on_headers_stop_iteration", None)

    def xds_no_buffer(d):
        del d["lds"]["resources"][0]["per_connection_buffer_limit_bytes"]

    def xds_route_buffer(d):
        # A route's request_body_buffer_limit in place of the listener's: not enough.
        li = d["lds"]["resources"][0]
        del li["per_connection_buffer_limit_bytes"]
        li["filter_chains"][0]["filters"][0]["typed_config"]["route_config"][
            "virtual_hosts"][0]["routes"][0]["request_body_buffer_limit"] = 67108864

    def xds_no_idle(d):
        li = d["lds"]["resources"][0]
        li["filter_chains"][0]["filters"][0]["typed_config"]["route_config"][
            "virtual_hosts"][0]["routes"][0]["route"]["idle_timeout"] = "0s"

    def eg_controller_namespace(d):
        values = next(v for f, v in d if f == "eg-values.yaml")
        del values["config"]["envoyGateway"]["provider"]["kubernetes"]["deploy"]

    def eg_no_stream_idle(d):
        del find(d, "ClientTrafficPolicy")["spec"]["timeout"]

    def istio_no_stream_idle(d):
        ef = find(d, "EnvoyFilter")["spec"]
        ef["configPatches"] = [cp for cp in ef["configPatches"] if cp["applyTo"] != "NETWORK_FILTER"]

    def istio_old_proxy(d):
        pod = find(d, "Deployment")["spec"]["template"]["spec"]
        recipes.container_named(pod["containers"], "istio-proxy")["image"] = "docker.io/istio/proxyv2:1.27.3"

    def istio_secret_elsewhere(d):
        find(d, "Deployment")["metadata"]["namespace"] = "istio-system"

    def _bridge(d, recipe):
        if recipe == "xds":
            return None
        if recipe == "istio":
            containers = find(d, "Deployment")["spec"]["template"]["spec"]["containers"]
        else:
            dep = find(d, "EnvoyProxy")["spec"]["provider"]["kubernetes"]["envoyDeployment"]
            containers = dep["patch"]["value"]["spec"]["template"]["spec"]["containers"]
        return recipes.container_named(containers, "llm-bridge")

    def _drop_arg(c, flag):
        c["args"] = [a for a in c["args"] if not a.startswith(flag + "=")]

    def eg_no_fleet_key(d):
        _drop_arg(_bridge(d, "envoy-gateway"), "--fleet-key-file")

    def istio_insecure(d):
        c = _bridge(d, "istio")
        _drop_arg(c, "--fleet-key-file")
        c["args"].append("--insecure-no-fleet-key")

    def istio_no_nats_auth(d):
        c = _bridge(d, "istio")
        _drop_arg(c, "--nats-user")
        _drop_arg(c, "--nats-password-file")

    def eg_two_nats_auths(d):
        _bridge(d, "envoy-gateway")["args"].append("--nats-token-file=/var/run/llm-bridge/nats/password")

    def eg_plain_nats(d):
        c = _bridge(d, "envoy-gateway")
        c["args"] = [a.replace("tls://", "nats://") for a in c["args"]]

    def istio_no_ca(d):
        _drop_arg(_bridge(d, "istio"), "--nats-ca")

    def istio_bridge_port(d):
        c = _bridge(d, "istio")
        c["args"] = [a.replace("127.0.0.1:10001", "127.0.0.1:10000") for a in c["args"]]

    def eg_fleet_key_unmounted(d):
        c = _bridge(d, "envoy-gateway")
        c["volumeMounts"] = [m for m in c["volumeMounts"] if m["name"] != "llm-fleet-key"]

    def istio_same_replica(d):
        c = _bridge(d, "istio")
        c["args"] = [a.replace("$(POD_NAME)", "gateway") for a in c["args"]]

    def eg_no_bridge(d):
        dep = find(d, "EnvoyProxy")["spec"]["provider"]["kubernetes"]["envoyDeployment"]
        spec = dep["patch"]["value"]["spec"]["template"]["spec"]
        spec["containers"] = [c for c in spec["containers"] if c["name"] != "llm-bridge"]

    def _unit(d, old, new):
        assert old in d[recipes.XDS_BRIDGE_UNIT]
        d[recipes.XDS_BRIDGE_UNIT] = d[recipes.XDS_BRIDGE_UNIT].replace(old, new)

    def xds_insecure(d):
        _unit(d, "--fleet-key-file /etc/llm-router/fleet.key", "--insecure-no-fleet-key")

    def xds_no_auth(d):
        _unit(d, "--nats-user llm-bridge \\\n  --nats-password-file /etc/llm-router/nats-password \\\n", "")

    def xds_plain_nats(d):
        _unit(d, "tls://nats.internal", "nats://nats.internal")

    def xds_no_ca(d):
        _unit(d, "--nats-ca /etc/llm-router/nats-ca.pem \\\n", "")

    def xds_inline_bridge_token(d):
        _unit(d, "--token-file /etc/llm-router/stats-token", "--token change-me")

    def xds_not_watched(d):
        del d["bootstrap"]["dynamic_resources"]["lds_config"]["path_config_source"]["watched_directory"]

    return [
        ("envoy-gateway", "allow_on_headers_stop_iteration removed", eg_no_allow, "allow_on_headers_stop_iteration"),
        ("envoy-gateway", "failure_policy FAIL_OPEN", eg_fail_open, "failure_policy"),
        ("envoy-gateway", "HTTPRoute timeouts removed", eg_no_timeout, "timeout"),
        ("envoy-gateway", "filter appended after the router", eg_after_router, "router"),
        ("envoy-gateway", "pre-v1.10 listener name", eg_old_name, "does not generate"),
        ("envoy-gateway", "ClientTrafficPolicy buffer removed", eg_no_buffer, "32768"),
        ("envoy-gateway", "HTTPRoute rules reordered", eg_rules_reordered, "no route sends"),
        ("envoy-gateway", "Envoy 1.34 pinned", eg_old_envoy, ">= 1.35"),
        ("istio", "allow_on_headers_stop_iteration removed", istio_no_allow, "allow_on_headers_stop_iteration"),
        ("istio", "INSERT_AFTER the router", istio_after_router, "router"),
        ("istio", "Envoy's token from another Secret than the collector's", istio_token_elsewhere, "401"),
        ("istio", "a Secret shipping change-me", istio_change_me, "change-me"),
        ("envoy-gateway", "a token in the client-facing config", eg_public_token, "client-facing"),
        ("envoy-gateway", "Envoy's token env removed", eg_no_env, "does not set"),
        ("xds", "the stats config routes (no stats_only)", xds_stats_routes, "stats_only"),
        ("xds", "the stats config's token inline", xds_inline_token, "inline"),
        ("istio", "collector pushes to another port", istio_push_port, "stats listener"),
        ("istio", "collector readiness probe removed", istio_no_readiness, "readinessProbe"),
        ("envoy-gateway", "collector listens on loopback", eg_probe_loopback, "loopback"),
        ("xds", "allow_on_headers_stop_iteration removed", xds_no_allow, "allow_on_headers_stop_iteration"),
        ("xds", "the listener's buffer limit removed", xds_no_buffer, "1 MiB"),
        ("xds", "a route buffer limit in place of the listener's", xds_route_buffer, "1.37"),
        ("xds", "route idle_timeout 0s", xds_no_idle, "frozen engine"),
        ("envoy-gateway", "Envoy pods in the controller's namespace", eg_controller_namespace,
         "CreateContainerConfigError"),
        ("envoy-gateway", "no stream idle timeout", eg_no_stream_idle, "frozen engine"),
        ("istio", "no stream idle timeout", istio_no_stream_idle, "frozen engine"),
        ("istio", "istio-proxy pinned to 1.27", istio_old_proxy, "before 1.28"),
        ("istio", "the gateway in another namespace than its Secrets", istio_secret_elsewhere,
         "CreateContainerConfigError"),
        ("xds", "lds not watched", xds_not_watched, "watched_directory"),
        ("envoy-gateway", "the bridge without --fleet-key-file", eg_no_fleet_key, "--fleet-key-file"),
        ("istio", "the bridge with --insecure-no-fleet-key", istio_insecure, "--insecure-no-fleet-key"),
        ("istio", "the bridge without NATS authentication", istio_no_nats_auth, "no NATS authentication"),
        ("envoy-gateway", "the bridge with two NATS authentications", eg_two_nats_auths, "more than one"),
        ("envoy-gateway", "the bridge on nats:// (no TLS)", eg_plain_nats, "not a tls:// URL"),
        ("istio", "the bridge without --nats-ca", istio_no_ca, "--nats-ca"),
        ("istio", "the bridge reading the client-facing listener", istio_bridge_port, "replicas endpoint"),
        ("envoy-gateway", "the fleet key's Secret not mounted", eg_fleet_key_unmounted,
         "no mounted Secret"),
        ("istio", "one --replica for every pod", istio_same_replica, "own_replica"),
        ("envoy-gateway", "no bridge", eg_no_bridge, "no llm-bridge"),
        ("xds", "the bridge with --insecure-no-fleet-key", xds_insecure, "--insecure-no-fleet-key"),
        ("xds", "the bridge without NATS authentication", xds_no_auth, "no NATS authentication"),
        ("xds", "the bridge on nats:// (no TLS)", xds_plain_nats, "not a tls:// URL"),
        ("xds", "the bridge without --nats-ca", xds_no_ca, "--nats-ca"),
        ("xds", "the bridge's token inline", xds_inline_bridge_token, "--token-file"),
    ]


# ---------------------------------------------------------------------------------
# OCI


def oci_checks(tmp):
    build, verify = os.path.join(DEPLOY, "oci", "build"), os.path.join(DEPLOY, "oci", "verify")
    notes = []
    for fmt in ("artifact", "image"):
        out = os.path.join(tmp, f"oci-{fmt}")
        d1 = subprocess.run([build, "--format", fmt, "--out", out, "--tag", "check"], check=True,
                            capture_output=True, text=True).stdout.strip()
        d2 = subprocess.run([verify, out], capture_output=True, text=True)
        if d2.returncode != 0 or d2.stdout.strip() != d1:
            raise CheckFailed(f"oci {fmt}: verify failed: {d2.stderr}")
        again = subprocess.run([build, "--format", fmt, "--out", out + "-2", "--tag", "check"],
                               check=True, capture_output=True, text=True).stdout.strip()
        if again != d1:
            raise CheckFailed(f"oci {fmt}: not reproducible ({d1} then {again})")
        if shutil.which("skopeo"):
            p = subprocess.run(["skopeo", "inspect", "--raw", f"oci:{out}:check"],
                               capture_output=True, text=True)
            if p.returncode != 0:
                raise CheckFailed(f"skopeo inspect oci:{out}:check failed: {p.stderr}")
            raw = p.stdout.encode()
            if "sha256:" + hashlib.sha256(raw).hexdigest() != d1:
                raise CheckFailed(f"skopeo reads a manifest whose digest is not {d1}")
            notes.append(f"{fmt} {d1[:19]}... (skopeo inspect agrees)")
        else:
            notes.append(f"{fmt} {d1[:19]}...")
        # Broken layouts must be caught.
        blobs = os.path.join(out, "blobs", "sha256")
        victim = sorted(os.listdir(blobs))[0]
        with open(os.path.join(blobs, victim), "ab") as f:
            f.write(b"x")
        if subprocess.run([verify, out], capture_output=True).returncode == 0:
            raise CheckFailed(f"oci {fmt}: verify accepted a corrupted blob")
        other = os.path.join(tmp, "other.wasm")
        with open(WASM, "rb") as f, open(other, "wb") as g:
            g.write(f.read() + b"\0")
        if subprocess.run([verify, out + "-2", "--wasm", other], capture_output=True).returncode == 0:
            raise CheckFailed(f"oci {fmt}: verify accepted a layout whose wasm differs")
        if fmt == "artifact":
            untitled = os.path.join(tmp, "oci-untitled")
            shutil.copytree(out + "-2", untitled)
            drop_layer_title(untitled)
            p = subprocess.run([verify, untitled], capture_output=True, text=True)
            if p.returncode == 0 or "oras pull" not in p.stderr:
                raise CheckFailed("oci artifact: verify accepted a layer without the "
                                  f"plugin.wasm title that `oras pull` needs ({p.stderr})")
    return (", ".join(notes) + "; corrupted blob, different wasm and an untitled layer "
            "refused")


def drop_layer_title(layout):
    """Rewrites a layout's manifest without its layer's annotations (and the index to
    the new manifest): what `oras pull` would skip."""
    index_path = os.path.join(layout, "index.json")
    with open(index_path) as f:
        index = json.load(f)
    blobs = os.path.join(layout, "blobs", "sha256")
    desc = index["manifests"][0]
    with open(os.path.join(blobs, desc["digest"].split(":", 1)[1]), "rb") as f:
        manifest = json.loads(f.read())
    for layer in manifest["layers"]:
        layer.pop("annotations", None)
    data = json.dumps(manifest, separators=(",", ":"), sort_keys=True).encode()
    digest = hashlib.sha256(data).hexdigest()
    with open(os.path.join(blobs, digest), "wb") as f:
        f.write(data)
    desc.update(digest="sha256:" + digest, size=len(data))
    with open(index_path, "w") as f:
        json.dump(index, f)


# ---------------------------------------------------------------------------------
# Main


def main():
    ap = argparse.ArgumentParser(description="Offline checks of the deployment recipes.")
    ap.add_argument("--envoy", required=True, help="the envoy binary")
    ap.add_argument("--no-live", action="store_true", help="skip the live runs")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    a = ap.parse_args()
    # Stopped from outside: unwind, so every `finally` stops the processes it started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    for path in (WASM, os.path.join(BIN, "host-sim"), os.path.join(BIN, "engine-mock"),
                 os.path.join(BIN, "llm-collector")):
        if not os.path.exists(path):
            sys.exit(f"check: {path} is missing")
    tmp = tempfile.mkdtemp(prefix="llm-deploy-check-")
    failures = []

    def step(name, fn):
        t = time.monotonic()
        try:
            note = fn()
            print(f"ok   {name}" + (f": {note}" if note else "") + f" ({time.monotonic() - t:.1f}s)",
                  flush=True)
        except (CheckFailed, RecipeError, subprocess.SubprocessError, OSError, KeyError,
                ValueError, StopIteration) as e:
            detail = str(e) if isinstance(e, (CheckFailed, RecipeError)) else traceback.format_exc()
            print(f"FAIL {name}: {detail}", flush=True)
            failures.append(name)

    def parse_all():
        n = 0
        for dirpath, _, names in os.walk(DEPLOY):
            for fname in names:
                if fname.endswith((".yaml", ".yml")):
                    with open(os.path.join(dirpath, fname)) as f:
                        n += sum(1 for _ in yaml.safe_load_all(f))
        return f"{n} documents"

    step("every YAML file under deploy/ parses", parse_all)

    def versions():
        errs = version_problems(doc_texts())
        if errs:
            raise CheckFailed("\n  " + "\n  ".join(errs))
        return (f"Envoy >= {recipes.vstr(recipes.MIN_ENVOY)}, Envoy Gateway "
                f"v{recipes.vstr(recipes.MIN_ENVOY_GATEWAY)} to "
                f"v{recipes.vstr(recipes.LATEST_ENVOY_GATEWAY)}, Istio >= "
                f"{recipes.vstr(recipes.MIN_ISTIO)} wherever a version is named")
    step("version bounds in the recipes and docs", versions)

    def nats():
        errs = nats_problems()
        if errs:
            raise CheckFailed("\n  " + "\n  ".join(errs))
        return ("nats-server.conf requires a user and TLS; nats.yaml's Secrets and ConfigMap "
                "are created in its namespace; the bridges name its user and Service")
    step("nats: the bus's config and Kubernetes recipe", nats)
    rendered = {}
    for name in RECIPES:
        def do_render(name=name):
            r = render(name)
            errs = invariants(r)
            if errs:
                raise CheckFailed("\n  " + "\n  ".join(errs))
            rendered[name] = r
            path = os.path.join(tmp, f"{name}.rendered.yaml")
            with open(path, "w") as f:
                yaml.safe_dump(r.bootstrap, f, sort_keys=False)
            envoy_validate(a.envoy, path)
            texts = plugin_texts(r)
            for i, t in enumerate(texts):
                host_sim_check(t, tmp, f"{name}-{i}")
            return (f"invariants hold, envoy --mode validate OK, {len(texts)} plugin config(s) "
                    "pass host-sim check-config")
        step(f"{name}: render, invariants, validate", do_render)

    def xds_bootstrap_validates():
        # The example's own dynamic bootstrap, paths pointed at a copy of its files.
        etc = os.path.join(tmp, "xds-validate")
        os.makedirs(os.path.join(etc, "xds"))
        shutil.copy(WASM, os.path.join(etc, "plugin.wasm"))
        for name in recipes.XDS_FILES:
            with open(os.path.join(DEPLOY, "xds", name + ".yaml")) as f:
                text = f.read().replace(recipes.XDS_PREFIX + "/", etc + "/")
            with open(os.path.join(etc, ("xds/" if name != "bootstrap" else "") + name + ".yaml"), "w") as f:
                f.write(text)
        envoy_validate(a.envoy, os.path.join(etc, "bootstrap.yaml"))
    step("xds: the dynamic bootstrap passes envoy --mode validate", xds_bootstrap_validates)

    if not a.no_live:
        for name in ("envoy-gateway", "istio"):
            if name in rendered:
                step(f"{name}: live in Envoy with engine mocks and the collector",
                     lambda name=name: live_static(rendered[name], a.envoy, tmp))
        step("xds: live from its files, ECDS updates without restart",
             lambda: live_xds(os.path.join(DEPLOY, "xds"), a.envoy, tmp))

    step("oci: build, verify, reproducible", lambda: oci_checks(tmp))

    def self_test():
        caught = []
        for recipe, what, mutate, words in mutations():
            d = os.path.join(DEPLOY, recipe)
            docs = copy.deepcopy(recipes.load_xds(d) if recipe == "xds" else recipes.load_docs(d))
            mutate(docs)
            try:
                errs = invariants(render(recipe, docs))
            except RecipeError as e:
                errs = [str(e)]
            if not errs:
                raise CheckFailed(f"{recipe} with {what} passed the checks")
            if not any(words in e for e in errs):
                raise CheckFailed(f"{recipe} with {what} failed, but not for that reason: {errs}")
            caught.append(what)
        texts = doc_texts()
        for what, path, old, new, words in text_mutations():
            broken = dict(texts)
            for p in ([path] if path else list(broken)):
                if path and old not in broken[p]:
                    raise CheckFailed(f"text self-test {what!r}: {p} no longer says {old!r}")
                broken[p] = broken[p].replace(old, new)
            errs = version_problems(broken) + nats_problems(broken)
            for name in ("envoy-gateway", "istio"):
                errs += secret_namespace_problems(render(name), broken)
            if not any(words in e for e in errs):
                raise CheckFailed(f"with {what} the checks did not fail for that reason: {errs}")
            caught.append(what)
        return f"{len(caught)} broken recipes and docs caught"
    step("self-test: broken recipes fail", self_test)

    if a.keep or failures:
        print(f"work directory: {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    if failures:
        print(f"{len(failures)} check(s) failed: {', '.join(failures)}")
        sys.exit(1)
    print("all deploy checks passed")


if __name__ == "__main__":
    main()
