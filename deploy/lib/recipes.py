"""Renders each deployment recipe into the Envoy configuration it produces.

Envoy Gateway and Istio build Envoy's configuration themselves and the recipes patch
it (EnvoyPatchPolicy JSONPatch, EnvoyFilter). Offline there is no control plane, so
this module builds the part of their output the recipes touch, the way they build it
(listener and cluster names, the HCM with the router last, routes from the HTTPRoute
or VirtualService), applies the recipe's patches to it with the platform's semantics,
and wraps the result in a static bootstrap that a real Envoy can validate and run.
What it models, per platform, is listed in each render function.

Every renderer returns a `Rendered`: the bootstrap plus what the invariants need to
know about the recipe (the public and stats listeners, the plugin configs, the
collector's flags, the token in the Secret).
"""

import base64
import copy
import json
import os
import re
import shlex

import yaml

WASM_TYPE = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm"
HCM_NAME = "envoy.filters.network.http_connection_manager"
HCM_TYPE = ("type.googleapis.com/envoy.extensions.filters.network."
            "http_connection_manager.v3.HttpConnectionManager")
ROUTER_NAME = "envoy.filters.http.router"
ROUTER_TYPE = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
LISTENER_TYPE = "type.googleapis.com/envoy.config.listener.v3.Listener"
CLUSTER_TYPE = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
ROUTE_TYPE = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
ECDS_TYPE = "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig"


# Version bounds; the book's deploy page gives the source of each.
MIN_ENVOY = (1, 35)               # the Wasm filter's allow_on_headers_stop_iteration
# v1.5.5 bundles an Envoy API that knows allow_on_headers_stop_iteration (before it,
# Envoy Gateway refuses the patched listener); v1.7.0 leaves a route's idle_timeout to
# the ClientTrafficPolicy's streamIdleTimeout (before it, `timeouts.request: 0s` sets
# idle_timeout 0 whatever the listener says).
MIN_ENVOY_GATEWAY = (1, 7, 0)
LATEST_ENVOY_GATEWAY = (1, 9, 0)  # the newest Envoy Gateway release (its git tags)
MIN_ISTIO = (1, 28)               # istiod keeps allow_on_headers_stop_iteration
EG_CONTROLLER_NAMESPACE = "envoy-gateway-system"


def vstr(v):
    return ".".join(str(x) for x in v)


class RecipeError(Exception):
    """The recipe is malformed or inconsistent: a check failure, with the reason."""


class Rendered:
    def __init__(self, name, bootstrap, public_listener, stats_listener):
        self.name = name
        self.bootstrap = bootstrap
        self.public_listener = public_listener
        self.stats_listener = stats_listener
        self.secrets = {}              # token of each Secret the recipe ships, by name
        self.collector_secret = None   # (Secret, key) the collector's --token-file reads
        self.envoy_env = None          # {variable: (Secret, key)} of Envoy's container
        self.collector_args = None     # the collector container's args
        self.collector = None          # the collector container, probes included
        self.route_style = "header_match"  # or "cluster_header"
        self.pod_namespace = None      # where the Envoy pods run (Kubernetes recipes)
        self.secret_refs = []          # [(Secret, what refers to it)] of those pods
        self.bridges = []              # [Bridge] beside each Envoy
        self.notes = []


# ---------------------------------------------------------------------------------
# Loading


def load_docs(directory):
    """Every YAML document of every *.yaml file in `directory`, with its file name."""
    docs = []
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".yaml"):
            continue
        with open(os.path.join(directory, name)) as f:
            for doc in yaml.safe_load_all(f):
                if doc is not None:
                    docs.append((name, doc))
    return docs


def kinds(docs, kind):
    return [d for _, d in docs if isinstance(d, dict) and d.get("kind") == kind]


def one(docs, kind):
    found = kinds(docs, kind)
    if len(found) != 1:
        raise RecipeError(f"expected one {kind}, found {len(found)}")
    return found[0]


def parse_duration(d):
    """A protobuf or Kubernetes duration (0s, 120s, 1.5s, 5m, 1h30m) to seconds."""
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", str(d))
    if not parts or "".join(n + u for n, u in parts) != str(d):
        raise RecipeError(f"bad duration {d!r}")
    unit = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    return sum(float(n) * unit[u] for n, u in parts)


def parse_quantity(q):
    """Kubernetes quantity (64Mi, 1G, 1048576) to bytes."""
    m = re.fullmatch(r"(\d+)(Ki|Mi|Gi|k|M|G)?", str(q))
    if not m:
        raise RecipeError(f"bad quantity {q!r}")
    mult = {None: 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "k": 10**3, "M": 10**6,
            "G": 10**9}[m.group(2)]
    return int(m.group(1)) * mult


# ---------------------------------------------------------------------------------
# RFC 6902 JSON Patch (what Envoy Gateway applies, with EnsurePathExistsOnAdd)


def _pointer(path):
    if path == "":
        return []
    if not path.startswith("/"):
        raise RecipeError(f"JSON pointer {path!r} does not start with /")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def json_patch(doc, op):
    kind = op.get("op")
    parts = _pointer(op.get("path", ""))
    if not parts:
        raise RecipeError(f"patch {kind} on the whole resource")
    parent = doc
    for i, key in enumerate(parts[:-1]):
        if isinstance(parent, list):
            try:
                parent = parent[int(key)]
            except (ValueError, IndexError):
                raise RecipeError(f"path {op['path']}: no index {key}")
        elif isinstance(parent, dict):
            if key not in parent:
                if kind != "add":
                    raise RecipeError(f"path {op['path']}: no member {key}")
                parent[key] = [] if parts[i + 1] in ("-", "0") else {}
            parent = parent[key]
        else:
            raise RecipeError(f"path {op['path']}: {key} is not a container")
    last = parts[-1]
    value = copy.deepcopy(op.get("value"))
    if isinstance(parent, list):
        if last == "-":
            idx = len(parent)
        else:
            try:
                idx = int(last)
            except ValueError:
                raise RecipeError(f"path {op['path']}: {last} is not an index")
        if kind == "add":
            if not 0 <= idx <= len(parent):
                raise RecipeError(f"path {op['path']}: index {idx} out of range")
            parent.insert(idx, value)
        elif kind == "replace":
            parent[idx] = value
        elif kind == "remove":
            del parent[idx]
        else:
            raise RecipeError(f"unsupported patch op {kind}")
    else:
        if kind in ("add", "replace"):
            if kind == "replace" and last not in parent:
                raise RecipeError(f"path {op['path']}: nothing to replace")
            parent[last] = value
        elif kind == "remove":
            if last not in parent:
                raise RecipeError(f"path {op['path']}: nothing to remove")
            del parent[last]
        else:
            raise RecipeError(f"unsupported patch op {kind}")


# ---------------------------------------------------------------------------------
# Shared building blocks


def hcm(stat_prefix, route_config, http_filters):
    return {"name": HCM_NAME, "typed_config": {
        "@type": HCM_TYPE, "stat_prefix": stat_prefix, "route_config": route_config,
        "http_filters": http_filters}}


def router(**extra):
    return {"name": ROUTER_NAME, "typed_config": dict({"@type": ROUTER_TYPE}, **extra)}


def static_cluster(name, port):
    # Placeholder endpoints: the offline checks validate the shape, and the live run
    # points every cluster at an engine mock.
    return {"name": name, "type": "STATIC", "connect_timeout": "10s", "load_assignment": {
        "cluster_name": name, "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {
            "socket_address": {"address": "127.0.0.1", "port_value": port}}}}]}]}}


def bootstrap(listeners, clusters):
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
        "static_resources": {"listeners": listeners, "clusters": clusters},
    }


def hcms(listener):
    """The HttpConnectionManager configs of a listener (default chain included)."""
    chains = list(listener.get("filter_chains") or [])
    if listener.get("default_filter_chain"):
        chains.append(listener["default_filter_chain"])
    for chain in chains:
        for f in chain.get("filters") or []:
            tc = f.get("typed_config") or {}
            if f.get("name") == HCM_NAME or tc.get("@type") == HCM_TYPE:
                yield tc


def wasm_code_files(obj):
    """Every Wasm vm_config.code.local, for rewriting to the built filter."""
    if isinstance(obj, dict):
        if obj.get("@type") == WASM_TYPE:
            code = obj.get("config", {}).get("vm_config", {}).get("code", {})
            yield code
        for v in obj.values():
            yield from wasm_code_files(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from wasm_code_files(v)


def point_wasm_at(bootstrap_doc, wasm_path, expected_prefix):
    """Rewrites each local Wasm file under `expected_prefix` to the built filter."""
    for code in wasm_code_files(bootstrap_doc):
        local = code.get("local", {}).get("filename")
        if local is None:
            raise RecipeError(f"Wasm code is not a local file after rendering: {code}")
        if not local.startswith(expected_prefix):
            raise RecipeError(f"Wasm file {local} is not under {expected_prefix}, where "
                              "the recipe puts the plugin")
        code["local"]["filename"] = wasm_path


def shipped_secrets(docs):
    """The `token` of every Secret the recipe itself carries, by Secret name (the
    recipes ship none: the user creates the Secret with a generated token)."""
    out = {}
    for s in kinds(docs, "Secret"):
        token = (s.get("stringData") or {}).get("token")
        if token is None and "token" in (s.get("data") or {}):
            token = base64.b64decode(s["data"]["token"]).decode(errors="replace")
        out[s["metadata"]["name"]] = token
    return out


def secret_env(container):
    """{variable: (Secret, key)} of a container's env taken from Secrets."""
    out = {}
    for e in container.get("env") or []:
        ref = (e.get("valueFrom") or {}).get("secretKeyRef")
        if ref:
            out[e["name"]] = (ref.get("name"), ref.get("key"))
    return out


def pod_secret_refs(containers, volumes):
    """[(Secret, what refers to it)]: every Secret a pod's containers take env from
    and every Secret volume, optional ones included (they resolve or are empty)."""
    out = []
    for c in containers:
        for e in c.get("env") or []:
            ref = (e.get("valueFrom") or {}).get("secretKeyRef")
            if ref:
                out.append((ref.get("name"), f"container {c.get('name')} env {e.get('name')}"))
    for v in volumes:
        if "secret" in v:
            out.append((v["secret"].get("secretName"), f"volume {v.get('name')}"))
    return out


class Bridge:
    """An llm-bridge the recipe runs beside its Envoy: where it is, its command line,
    and (Kubernetes) {file it reads: (volume kind, its name, key) or None} for the
    files its flags name."""

    def __init__(self, where, args, files=None):
        self.where, self.args, self.files = where, list(args), files


# The bridge's flags that take no value.
BRIDGE_SWITCHES = ("--insecure-no-fleet-key", "-h", "--help", "-V", "--version")
# The bridge's flags that name a file it reads.
BRIDGE_FILE_FLAGS = ("--token-file", "--nats-creds", "--nats-nkey-file", "--nats-token-file",
                     "--nats-password-file", "--nats-ca", "--nats-cert", "--nats-key",
                     "--fleet-key-file")


def flags(args):
    """{flag: [values]} of a command line, `--flag=value` and `--flag value` alike (a
    switch maps to [None])."""
    out, i = {}, 0
    while i < len(args):
        a = args[i]
        if a.startswith("--") and "=" in a:
            k, v = a.split("=", 1)
        elif a in BRIDGE_SWITCHES or i + 1 >= len(args):
            k, v = a, None
        else:
            k, v = a, args[i + 1]
            i += 1
        out.setdefault(k, []).append(v)
        i += 1
    return out


def mounted_file(container, volumes, path):
    """(volume kind, Secret or ConfigMap name, key) a container's file comes from,
    following its mounts; None when it is on no Secret or ConfigMap."""
    for m in container.get("volumeMounts", []):
        if path.startswith(m["mountPath"].rstrip("/") + "/"):
            for v in volumes:
                if v["name"] != m["name"]:
                    continue
                key = path[len(m["mountPath"]):].strip("/")
                if "secret" in v:
                    return "Secret", v["secret"].get("secretName"), key
                if "configMap" in v:
                    return "ConfigMap", v["configMap"].get("name"), key
    return None


def pod_bridges(containers, volumes):
    out = []
    for c in containers:
        if c.get("name") != "llm-bridge":
            continue
        args = list(c.get("command") or [])[1:] + list(c.get("args") or [])
        files = {}
        for k, vs in flags(args).items():
            if k in BRIDGE_FILE_FLAGS:
                for v in vs:
                    files[v] = mounted_file(c, volumes, v or "")
        out.append(Bridge("container llm-bridge", args, files))
    return out


def unit_exec_start(text):
    """The ExecStart= command line of a systemd unit, continuation lines joined."""
    joined = re.sub(r"\\\n", " ", text)
    for line in joined.splitlines():
        if line.startswith("ExecStart="):
            return shlex.split(line[len("ExecStart="):])
    raise RecipeError("the unit has no ExecStart=")


def container_named(containers, name):
    for c in containers:
        if c.get("name") == name:
            return c
    raise RecipeError(f"no {name} container")


def collector_container(containers):
    return container_named(containers, "llm-collector")


def token_secret_of(collector, volumes):
    """The Secret the collector's --token-file comes from, following the mount."""
    token_file = None
    for a in collector.get("args", []):
        if a.startswith("--token-file="):
            token_file = a.split("=", 1)[1]
    if token_file is None:
        raise RecipeError("the collector has no --token-file")
    for m in collector.get("volumeMounts", []):
        if token_file.startswith(m["mountPath"].rstrip("/") + "/"):
            for v in volumes:
                if v["name"] == m["name"] and "secret" in v:
                    return v["secret"]["secretName"], token_file[len(m["mountPath"]):].strip("/")
    raise RecipeError(f"--token-file {token_file} is not on a mounted Secret")


# ---------------------------------------------------------------------------------
# Envoy Gateway


def render_envoy_gateway(docs, wasm_path):
    """Models Envoy Gateway (v1.10, XDSNameSchemeV2 names) for one HTTP Gateway listener:
    the xDS listener `tcp-<port>` bound on port+10000 below 1024, its HCM in
    `default_filter_chain` with the router as the only (last) HTTP filter, route config
    `http-<port>`, one cluster per HTTPRoute rule named
    `httproute/<ns>/<route>/rule/<i>`, HTTPRoute header matches and
    `timeouts.request`, ClientTrafficPolicy `connection.bufferLimit` as
    `per_connection_buffer_limit_bytes`; then the EnvoyPatchPolicy's JSON patches."""
    gateway = one(docs, "Gateway")
    gw_ns = gateway["metadata"]["namespace"]
    gw_name = gateway["metadata"]["name"]
    http = [li for li in gateway["spec"]["listeners"] if li["protocol"] == "HTTP"]
    if len(http) != 1:
        raise RecipeError("expected one HTTP listener on the Gateway")
    port = http[0]["port"]
    listener_name = f"tcp-{port}"
    route_name = f"http-{port}"
    bind_port = port + 10000 if port < 1024 else port

    # A ClientTrafficPolicy's streamIdleTimeout is the HCM's stream_idle_timeout; from
    # v1.7.0 a route then gets no idle_timeout of its own. Without it, a route with a
    # request timeout gets idle_timeout max(1h, timeout), or 0 when the timeout is 0.
    listener_idle = None
    for ctp in kinds(docs, "ClientTrafficPolicy"):
        sit = (((ctp["spec"].get("timeout") or {}).get("http")) or {}).get("streamIdleTimeout")
        if sit is not None:
            listener_idle = sit
    route_idle = None
    for btp in kinds(docs, "BackendTrafficPolicy"):
        sit = (((btp["spec"].get("timeout") or {}).get("http")) or {}).get("streamIdleTimeout")
        if sit is not None:
            route_idle = sit
    routes, clusters = [], []
    for hr in kinds(docs, "HTTPRoute"):
        ns, name = hr["metadata"]["namespace"], hr["metadata"]["name"]
        if not any(p.get("name") == gw_name for p in hr["spec"].get("parentRefs", [])):
            continue
        for i, rule in enumerate(hr["spec"]["rules"]):
            cluster = f"httproute/{ns}/{name}/rule/{i}"
            refs = rule.get("backendRefs") or []
            if len(refs) != 1:
                raise RecipeError(f"HTTPRoute {name} rule {i}: expected one backendRef")
            clusters.append(static_cluster(cluster, refs[0]["port"]))
            action = {"cluster": cluster}
            timeout = (rule.get("timeouts") or {}).get("request")
            if timeout is not None:
                action["timeout"] = timeout
            if route_idle is not None:
                action["idle_timeout"] = route_idle
            elif listener_idle is None and timeout is not None:
                t = parse_duration(timeout)
                action["idle_timeout"] = "0s" if t == 0 else f"{max(3600, t):g}s"
            for m in rule.get("matches") or [{}]:
                match = {"prefix": (m.get("path") or {}).get("value", "/")}
                headers = [{"name": h["name"], "string_match": {"exact": h["value"]}}
                           for h in m.get("headers", [])]
                if headers:
                    match["headers"] = headers
                routes.append({"match": match, "route": dict(action)})
    route_configs = {route_name: {"name": route_name, "virtual_hosts": [
        {"name": f"{gw_ns}/{gw_name}/http/*", "domains": ["*"], "routes": routes}]}}

    listener = {
        "name": listener_name,
        "address": {"socket_address": {"address": "0.0.0.0", "port_value": bind_port}},
        "default_filter_chain": {"filters": [
            hcm(f"http-{bind_port}", {"name": route_name}, [router(suppress_envoy_headers=True)])
        ]},
    }
    # Envoy Gateway gives its listeners a 32 KiB buffer unless a ClientTrafficPolicy
    # sets one.
    listener["per_connection_buffer_limit_bytes"] = 32768
    for ctp in kinds(docs, "ClientTrafficPolicy"):
        limit = (ctp["spec"].get("connection") or {}).get("bufferLimit")
        if limit is not None:
            listener["per_connection_buffer_limit_bytes"] = parse_quantity(limit)
    if listener_idle is not None:
        for h in hcms(listener):
            h["stream_idle_timeout"] = f"{parse_duration(listener_idle):g}s"
    listeners = {listener_name: listener}
    cluster_map = {c["name"]: c for c in clusters}

    epp = one(docs, "EnvoyPatchPolicy")
    if epp["spec"].get("targetRef", {}).get("name") != gw_name:
        raise RecipeError("the EnvoyPatchPolicy does not target the Gateway")
    if epp["metadata"]["namespace"] != gw_ns:
        raise RecipeError("the EnvoyPatchPolicy must be in the Gateway's namespace")
    stores = {LISTENER_TYPE: listeners, CLUSTER_TYPE: cluster_map, ROUTE_TYPE: route_configs}
    for p in epp["spec"]["jsonPatches"]:
        store = stores.get(p["type"])
        if store is None:
            raise RecipeError(f"patch of unsupported type {p['type']}")
        op = p["operation"]
        if op["op"] == "add" and op.get("path", "") == "":
            store[op["value"]["name"]] = copy.deepcopy(op["value"])
            continue
        if p["name"] not in store:
            raise RecipeError(f"EnvoyPatchPolicy patches {p['name']}, which Envoy Gateway "
                              f"does not generate for this Gateway (it makes {sorted(store)})")
        json_patch(store[p["name"]], op)

    # RDS in Envoy Gateway; inline here so one static bootstrap holds everything.
    for li in listeners.values():
        for h in hcms(li):
            rc = h.get("route_config")
            if rc and set(rc) == {"name"}:
                h["route_config"] = route_configs[rc["name"]]

    proxy = one(docs, "EnvoyProxy")
    dep = proxy["spec"]["provider"]["kubernetes"]["envoyDeployment"]
    mounts = dep.get("container", {}).get("volumeMounts", [])
    wasm_mount = None
    for ic in dep.get("initContainers", []):
        args = ic.get("args", [])
        if "pull" in args and "--output" in args:
            out = args[args.index("--output") + 1]
            if any(m["mountPath"] == out for m in mounts):
                wasm_mount = out
    if wasm_mount is None:
        raise RecipeError("no init container pulls the plugin into a volume Envoy mounts")
    doc = bootstrap(list(listeners.values()), list(cluster_map.values()))
    point_wasm_at(doc, wasm_path, wasm_mount.rstrip("/") + "/plugin.wasm")

    r = Rendered("envoy-gateway", doc, listener_name, None)
    stats = [n for n in listeners if n != listener_name]
    if len(stats) != 1:
        raise RecipeError(f"expected one added stats listener, found {stats}")
    r.stats_listener = stats[0]
    patch_containers = (dep.get("patch", {}).get("value", {}).get("spec", {})
                        .get("template", {}).get("spec", {}).get("containers", []))
    collector = collector_container(patch_containers)
    r.collector_secret = token_secret_of(collector, dep.get("pod", {}).get("volumes", []))
    r.secrets = shipped_secrets(docs)
    r.envoy_env = secret_env(dep.get("container", {}))
    r.collector_args = collector["args"]
    r.collector = collector
    image = dep.get("container", {}).get("image")
    if image:
        m = re.search(r"v?(\d+)\.(\d+)\.\d+$", image)
        if not m or (int(m.group(1)), int(m.group(2))) < MIN_ENVOY:
            raise RecipeError(f"Envoy image {image}: allow_on_headers_stop_iteration needs "
                              f"Envoy >= {vstr(MIN_ENVOY)}")
    # Where Envoy Gateway runs the Envoy pods: the controller's namespace unless its
    # config (eg-values.yaml) says deploy.type GatewayNamespace.
    values = [d for f, d in docs if f == "eg-values.yaml"]
    kube = ((((values[0] if values else {}).get("config") or {}).get("envoyGateway") or {})
            .get("provider") or {}).get("kubernetes") or {}
    deploy_type = (kube.get("deploy") or {}).get("type") or "ControllerNamespace"
    r.pod_namespace = gw_ns if deploy_type == "GatewayNamespace" else EG_CONTROLLER_NAMESPACE
    r.secret_refs = pod_secret_refs(
        [dict(dep.get("container", {}), name="envoy")] + list(dep.get("initContainers", []))
        + list(patch_containers), dep.get("pod", {}).get("volumes", []))
    r.bridges = pod_bridges(patch_containers, dep.get("pod", {}).get("volumes", []))
    return r


# ---------------------------------------------------------------------------------
# Istio


def _istio_listener_matches(listener, match):
    lm = (match or {}).get("listener")
    if lm is None:
        return True
    port = listener["address"]["socket_address"]["port_value"]
    if "portNumber" in lm and lm["portNumber"] != port:
        return False
    if "name" in lm and lm["name"] != listener["name"]:
        return False
    return True


def _merge(dst, src):
    """Protobuf merge: messages merge field by field, repeated fields append."""
    for k, v in src.items():
        if isinstance(v, dict) and isinstance(dst.get(k), dict):
            _merge(dst[k], v)
        elif isinstance(v, list) and isinstance(dst.get(k), list):
            dst[k].extend(copy.deepcopy(v))
        else:
            dst[k] = copy.deepcopy(v)


def render_istio(docs, wasm_path):
    """Models Istio's gateway output for one HTTP server: listener `0.0.0.0_<port>`,
    an HCM whose HTTP filters end with cors, fault and the router (as on Istio gateways),
    routes from the VirtualService (header `exact` matches, clusters named
    `outbound|<port>||<host>`, timeout 0s unless the VirtualService sets one: Istio
    disables Envoy's default), then the EnvoyFilter patches (EXTENSION_CONFIG ADD,
    HTTP_FILTER INSERT_BEFORE/AFTER/FIRST, LISTENER MERGE and ADD; patches apply to the
    generated listeners, added listeners are used as given) and what the Istio agent
    does to an ECDS Wasm config: the remote (oci:// or https://) module becomes a local
    file. The ECDS config is inlined where a filter names it, so one static bootstrap
    holds what Envoy runs."""
    gw = one(docs, "Gateway")
    gw_name = gw["metadata"]["name"]
    servers = [s for s in gw["spec"]["servers"] if s["port"]["protocol"] == "HTTP"]
    if len(servers) != 1:
        raise RecipeError("expected one HTTP server on the Gateway")
    port = servers[0]["port"]["number"]
    listener_name = f"0.0.0.0_{port}"

    routes, clusters = [], {}
    for vs in kinds(docs, "VirtualService"):
        if gw_name not in vs["spec"].get("gateways", []):
            continue
        for http in vs["spec"]["http"]:
            dests = http.get("route") or []
            if len(dests) != 1:
                raise RecipeError("expected one destination per VirtualService route")
            d = dests[0]["destination"]
            dport = d["port"]["number"]
            cluster = f"outbound|{dport}||{d['host']}"
            clusters[cluster] = static_cluster(cluster, dport)
            action = {"cluster": cluster, "timeout": http.get("timeout", "0s")}
            for m in http.get("match") or [{}]:
                headers = []
                for hname, hm in (m.get("headers") or {}).items():
                    if set(hm) != {"exact"}:
                        raise RecipeError(f"header match {hname}: only `exact` is modelled")
                    headers.append({"name": hname, "string_match": {"exact": hm["exact"]}})
                match = {"prefix": "/"}
                if headers:
                    match["headers"] = headers
                routes.append({"match": match, "route": dict(action)})
    route_config = {"name": f"http.{port}", "virtual_hosts": [
        {"name": "*:80", "domains": ["*"], "routes": routes}]}
    listener = {
        "name": listener_name,
        "address": {"socket_address": {"address": "0.0.0.0", "port_value": port}},
        "filter_chains": [{"filters": [hcm(f"outbound_0.0.0.0_{port}", route_config, [
            {"name": "envoy.filters.http.cors", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.cors.v3.Cors"}},
            {"name": "envoy.filters.http.fault", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault"}},
            router(),
        ])]}],
    }
    # Istio disables the HCM's stream idle timeout on every HTTP listener.
    for h in hcms(listener):
        h["stream_idle_timeout"] = "0s"
    listeners = [listener]
    added, ecds = [], {}

    deployment = None
    for d in kinds(docs, "Deployment"):
        if d["spec"]["template"]["metadata"].get("annotations", {}).get(
                "inject.istio.io/templates") == "gateway":
            deployment = d
    if deployment is None:
        raise RecipeError("no gateway Deployment (inject.istio.io/templates: gateway)")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    if not set(gw["spec"]["selector"].items()) <= set(pod_labels.items()):
        raise RecipeError("the Gateway's selector does not select the gateway pods")

    efs = kinds(docs, "EnvoyFilter")
    if not efs:
        raise RecipeError("no EnvoyFilter")
    for ef in efs:
        sel = ef["spec"].get("workloadSelector", {}).get("labels", {})
        if not set(sel.items()) <= set(pod_labels.items()):
            raise RecipeError(f"EnvoyFilter {ef['metadata']['name']} does not select the "
                              "gateway pods")
        for cp in ef["spec"]["configPatches"]:
            match, patch = cp.get("match") or {}, cp["patch"]
            if match.get("context", "ANY") not in ("GATEWAY", "ANY"):
                continue
            op, value = patch["operation"], patch.get("value")
            if cp["applyTo"] == "EXTENSION_CONFIG":
                if op != "ADD":
                    raise RecipeError(f"EXTENSION_CONFIG {op} is not modelled")
                ecds[value["name"]] = copy.deepcopy(value)
            elif cp["applyTo"] == "LISTENER":
                if op == "ADD":
                    added.append(copy.deepcopy(value))
                elif op == "MERGE":
                    for li in listeners:
                        if _istio_listener_matches(li, match):
                            _merge(li, value)
                else:
                    raise RecipeError(f"LISTENER {op} is not modelled")
            elif cp["applyTo"] == "NETWORK_FILTER":
                if op != "MERGE":
                    raise RecipeError(f"NETWORK_FILTER {op} is not modelled")
                fname = (((match.get("listener") or {}).get("filterChain") or {})
                         .get("filter") or {}).get("name")
                hit = False
                for li in listeners:
                    if not _istio_listener_matches(li, match):
                        continue
                    for chain in li.get("filter_chains") or []:
                        for f in chain.get("filters") or []:
                            if fname in (None, f.get("name")):
                                _merge(f, value)
                                hit = True
                if not hit:
                    raise RecipeError(f"NETWORK_FILTER patch matches no filter: {match}")
            elif cp["applyTo"] == "HTTP_FILTER":
                fc = ((match.get("listener") or {}).get("filterChain") or {}).get("filter") or {}
                sub = (fc.get("subFilter") or {}).get("name")
                hit = False
                for li in listeners:
                    if not _istio_listener_matches(li, match):
                        continue
                    for h in hcms(li):
                        if fc.get("name") not in (None, HCM_NAME):
                            continue
                        filters = h["http_filters"]
                        names = [f["name"] for f in filters]
                        new = copy.deepcopy(value)
                        if op == "INSERT_FIRST":
                            filters.insert(0, new)
                        elif op == "ADD":
                            filters.append(new)
                        elif op in ("INSERT_BEFORE", "INSERT_AFTER"):
                            if sub not in names:
                                continue
                            i = names.index(sub) + (op == "INSERT_AFTER")
                            filters.insert(i, new)
                        else:
                            raise RecipeError(f"HTTP_FILTER {op} is not modelled")
                        hit = True
                if not hit:
                    raise RecipeError(f"HTTP_FILTER patch matches no listener: {match}")
            else:
                raise RecipeError(f"applyTo {cp['applyTo']} is not modelled")
    listeners.extend(added)

    # The Istio agent fetches the module and hands Envoy a local file.
    for name, ext in ecds.items():
        tc = ext.get("typed_config", {})
        code = tc.get("config", {}).get("vm_config", {}).get("code", {})
        remote = code.get("remote")
        if remote is None:
            raise RecipeError(f"ECDS {name}: expected a remote (oci:// or https://) module")
        uri = remote.get("http_uri", {}).get("uri", "")
        if not re.match(r"(oci|https?)://", uri):
            raise RecipeError(f"ECDS {name}: module URL {uri!r} is not oci:// or http(s)://")
        if not re.fullmatch(r"[0-9a-f]{64}", str(remote.get("sha256", ""))):
            raise RecipeError(f"ECDS {name}: sha256 must be 64 lowercase hex digits")
        code.pop("remote")
        code["local"] = {"filename": "/var/lib/istio/data/llm-router.wasm"}
    for li in listeners:
        for h in hcms(li):
            for i, f in enumerate(h["http_filters"]):
                cd = f.get("config_discovery")
                if cd is None:
                    continue
                if WASM_TYPE not in cd.get("type_urls", []):
                    raise RecipeError(f"filter {f['name']}: config_discovery without the Wasm type")
                if f["name"] not in ecds:
                    raise RecipeError(f"filter {f['name']}: no EXTENSION_CONFIG named so")
                h["http_filters"][i] = {"name": f["name"],
                                        "typed_config": copy.deepcopy(ecds[f["name"]]["typed_config"])}
    doc = bootstrap(listeners, list(clusters.values()))
    point_wasm_at(doc, wasm_path, "/var/lib/istio/data/")
    stats = [li["name"] for li in added]
    if len(stats) != 1:
        raise RecipeError(f"expected one added stats listener, found {stats}")
    r = Rendered("istio", doc, listener_name, stats[0])
    pod = deployment["spec"]["template"]["spec"]
    collector = collector_container(pod["containers"])
    r.collector_secret = token_secret_of(collector, pod.get("volumes", []))
    r.secrets = shipped_secrets(docs)
    proxy = container_named(pod["containers"], "istio-proxy")
    r.envoy_env = secret_env(proxy)
    r.collector_args = collector["args"]
    r.collector = collector
    r.pod_namespace = deployment["metadata"]["namespace"]
    r.secret_refs = pod_secret_refs(pod["containers"], pod.get("volumes", []))
    r.bridges = pod_bridges(pod["containers"], pod.get("volumes", []))
    image = proxy.get("image", "auto")
    if image != "auto":
        m = re.search(r":(\d+)\.(\d+)(\.\d+)?[^:/]*$", image)
        if not m or (int(m.group(1)), int(m.group(2))) < MIN_ISTIO:
            raise RecipeError(f"istio-proxy image {image}: Istio before {vstr(MIN_ISTIO)} "
                              "drops allow_on_headers_stop_iteration from the EnvoyFilter "
                              "(requests hang); leave `image: auto` or pin "
                              f"{vstr(MIN_ISTIO)} or later")
    return r


# ---------------------------------------------------------------------------------
# Plain Envoy + file-based xDS


XDS_PREFIX = "/etc/llm-router"


# The example's files (without .yaml); `ecds*` hold one filter config each (Envoy's
# ECDS takes exactly one resource per response, and a file is one response).
XDS_FILES = ("bootstrap", "lds", "cds", "ecds", "ecds-stats")
ECDS_FILES = ("ecds", "ecds-stats")


# The bridge beside the example's Envoy: a systemd unit (its text, not YAML).
XDS_BRIDGE_UNIT = "llm-bridge.service"


def load_xds(directory):
    """The example's files, parsed (the bridge's unit as text)."""
    out = {}
    for name in XDS_FILES:
        with open(os.path.join(directory, name + ".yaml")) as f:
            out[name] = yaml.safe_load(f)
    with open(os.path.join(directory, XDS_BRIDGE_UNIT)) as f:
        out[XDS_BRIDGE_UNIT] = f.read()
    return out


def _resources(discovery, type_url, what):
    res = discovery.get("resources") or []
    for r in res:
        if r.get("@type") != type_url:
            raise RecipeError(f"{what}: resource of type {r.get('@type')}, expected {type_url}")
    if not discovery.get("version_info"):
        raise RecipeError(f"{what}: no version_info")
    return res


def render_xds(files, wasm_path):
    """The static equivalent of the xDS example: the listeners of lds.yaml and clusters
    of cds.yaml as static resources, each filter's config_discovery replaced by the
    ecds.yaml config it names. (The live check runs the example's own dynamic files.)"""
    b = files["bootstrap"]
    dyn = b.get("dynamic_resources") or {}
    for key, fname in (("lds_config", "lds.yaml"), ("cds_config", "cds.yaml")):
        pcs = (dyn.get(key) or {}).get("path_config_source") or {}
        if pcs.get("path") != f"{XDS_PREFIX}/xds/{fname}":
            raise RecipeError(f"bootstrap {key} does not read {XDS_PREFIX}/xds/{fname}")
        if not pcs.get("watched_directory"):
            raise RecipeError(f"bootstrap {key}: no watched_directory, so a `mv` of a new "
                              "file would not be noticed")
    listeners = copy.deepcopy(_resources(files["lds"], LISTENER_TYPE, "lds.yaml"))
    clusters = copy.deepcopy(_resources(files["cds"], CLUSTER_TYPE, "cds.yaml"))
    ecds = {}
    for fname in ECDS_FILES:
        res = _resources(files[fname], ECDS_TYPE, f"{fname}.yaml")
        if len(res) != 1:
            raise RecipeError(f"{fname}.yaml holds {len(res)} configs: ECDS takes one per file")
        ecds[f"{XDS_PREFIX}/xds/{fname}.yaml"] = res[0]
    for li in listeners:
        li.pop("@type")
        for h in hcms(li):
            for i, f in enumerate(h["http_filters"]):
                cd = f.get("config_discovery")
                if cd is None:
                    continue
                pcs = cd.get("config_source", {}).get("path_config_source", {})
                ext = ecds.get(pcs.get("path"))
                if ext is None:
                    raise RecipeError(f"filter {f['name']}: config_discovery reads "
                                      f"{pcs.get('path')}, not one of the ecds files")
                if ext["name"] != f["name"]:
                    raise RecipeError(f"filter {f['name']}: {pcs['path']} holds {ext['name']}")
                h["http_filters"][i] = {"name": f["name"],
                                        "typed_config": copy.deepcopy(ext["typed_config"])}
    for c in clusters:
        c.pop("@type")
        c["type"] = "STATIC"
        for e in c["load_assignment"]["endpoints"]:
            for lb in e["lb_endpoints"]:
                lb["endpoint"]["address"]["socket_address"]["address"] = "127.0.0.1"
    doc = bootstrap(listeners, clusters)
    point_wasm_at(doc, wasm_path, XDS_PREFIX + "/")
    public = [li["name"] for li in listeners
              if li["address"]["socket_address"]["address"] not in ("127.0.0.1", "::1")]
    stats = [li["name"] for li in listeners if li["name"] not in public]
    if len(public) != 1 or len(stats) != 1:
        raise RecipeError("expected one public and one loopback listener in lds.yaml")
    r = Rendered("xds", doc, public[0], stats[0])
    r.route_style = "cluster_header"
    if files.get(XDS_BRIDGE_UNIT) is not None:
        r.bridges = [Bridge(XDS_BRIDGE_UNIT, unit_exec_start(files[XDS_BRIDGE_UNIT])[1:])]
    return r


def plugin_config_text(typed_config):
    cfg = typed_config.get("config", {}).get("configuration", {})
    if cfg.get("@type") != "type.googleapis.com/google.protobuf.StringValue":
        raise RecipeError("the plugin configuration is not a google.protobuf.StringValue")
    return cfg.get("value", "")


def plugin_config(typed_config):
    text = plugin_config_text(typed_config)
    try:
        return json.loads(text)
    except ValueError as e:
        raise RecipeError(f"the plugin configuration is not JSON: {e}")
