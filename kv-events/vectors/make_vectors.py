#!/usr/bin/env python3
"""Writes the test vectors of llm-kv-events by running the engines' own code.

Nothing here re-implements an engine: the hashing functions, the event structs and
SGLang's event recorder are read by name out of the engines' source files, at run
time, and executed as they are (SGLang's page hash is C++, compiled here from its
own file). What this script adds is only the stubs those functions need around
them (a request object, a radix-tree node, a logger) and the inputs.

Sources, as used for the committed vectors (the JSON files record the SHA-256 of
every file read):

  vLLM 0.34.0   PyPI wheel vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl,
                commit g62d4bc3c7 (vllm/_version.py)
                  vllm/utils/hashing.py             sha256_cbor
                  vllm/v1/core/kv_cache_utils.py    hash_block_tokens, init_none_hash,
                                                    get_request_block_hasher, ...
                  vllm/v1/core/block_pool.py        BlockPool._build_block_stored_event
                  vllm/distributed/kv_events.py     EventBatch, BlockStored, ...
  vLLM 0.20.0   PyPI wheel, commit gb8160878f: the same files (the last events
                encoded as positional arrays among the releases looked at)
  SGLang 0.5.23 PyPI wheel sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl
                  sglang/srt/mem_cache/cpp_utils/hash_binding.cpp   page hash (C++)
                  sglang/srt/mem_cache/cpp_utils/native_hash.py
                  sglang/srt/mem_cache/utils.py     compute_node_hash_values, ...
                  sglang/srt/mem_cache/radix_cache.py  RadixKey
                  sglang/srt/mem_cache/events.py    KVCacheEventRecorder
                  sglang/srt/disaggregation/kv_events.py  EventBatch, BlockStored, ...
  SGLang 0.5.2  PyPI wheel sglang-0.5.2-py3-none-any.whl
                  sglang/srt/disaggregation/kv_events.py (positional arrays)

Regenerate (see ../README.md):

  python3 -m venv /tmp/kvvenv && /tmp/kvvenv/bin/pip install cbor2 msgspec pybind11
  pip download --no-deps --only-binary :all: vllm==0.34.0   # and 0.20.0, sglang==0.5.23, 0.5.2
  unzip each wheel into its own directory
  /tmp/kvvenv/bin/python make_vectors.py --vllm DIR --vllm-legacy DIR \
      --sglang DIR --sglang-legacy DIR --out .

Needs g++ and OpenSSL's headers (libssl-dev) for SGLang's hash. cbor2 6.3.0,
msgspec 0.23.0 and pybind11 3.1.0 made the committed files.
"""

import argparse
import ast
import enum
import hashlib
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
import time
import types
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, List, Literal, NewType, Optional, TypeAlias, Union, cast

import cbor2
import msgspec

SOURCES: list[dict] = []
# Which release the files being read belong to, for SOURCES.
RELEASE = {"name": ""}


def read_source(root: Path, rel: str) -> tuple[str, str]:
    path = root / rel
    text = path.read_text()
    SOURCES.append({"release": RELEASE["name"], "file": rel, "sha256": hashlib.sha256(text.encode()).hexdigest()})
    return text, str(path)


def node_name(node: ast.stmt) -> str | None:
    if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
        return node.name
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        return node.targets[0].id
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return node.target.id
    return None


def segment(text: str, node: ast.stmt) -> str:
    lines = text.splitlines()
    start = min([d.lineno for d in getattr(node, "decorator_list", [])] + [node.lineno])
    return "\n".join(lines[start - 1 : node.end_lineno])


def load(root: Path, rel: str, names: list[str], ns: dict, within: str | None = None) -> None:
    """Executes the top-level definitions `names` of `root/rel` (or of its class
    `within`), verbatim and in file order, into `ns`."""
    text, path = read_source(root, rel)
    body = ast.parse(text).body
    if within is not None:
        (cls,) = [n for n in body if isinstance(n, ast.ClassDef) and n.name == within]
        body = cls.body
    picked = [n for n in body if node_name(n) in names]
    missing = set(names) - {node_name(n) for n in picked}
    if missing:
        raise SystemExit(f"{rel}: not found: {sorted(missing)}")
    code = "\n\n".join(textwrap.dedent(segment(text, n)) for n in picked)
    if "from __future__ import annotations" in text:
        code = "from __future__ import annotations\n" + code
    exec(compile(code, path, "exec"), ns)


def version_of(root: Path, package: str) -> dict:
    """The release and, where the wheel records it, the commit it was built from."""
    ns: dict = {}
    for name in ("_version.py", "version.py"):
        path = root / package / name
        if path.exists():
            exec(path.read_text(), ns)
            break
    return {"version": ns.get("__version__"), "commit": ns.get("__commit_id__")}


class Logger:
    def __getattr__(self, _name):
        return lambda *a, **k: None


def base_ns() -> dict:
    return {
        "__name__": "vectors",
        "Any": Any, "Optional": Optional, "Union": Union, "List": List, "Literal": Literal,
        "NewType": NewType, "TypeAlias": TypeAlias, "cast": cast,
        "Callable": Callable, "Iterable": Iterable, "Iterator": Iterator, "Sequence": Sequence,
        "hashlib": hashlib, "os": os, "enum": enum, "array": array, "msgspec": msgspec, "cbor2": cbor2,
        "logger": Logger(), "time": time,
    }


# --------------------------------------------------------------------------- vLLM


def vllm_ns(root: Path, modern: bool) -> dict:
    ns = base_ns()
    ns["envs"] = types.SimpleNamespace(VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=True)
    # Stand-ins for names the loaded code only mentions (annotations, the
    # non-cryptographic hash set); none is called for sha256_cbor.
    for stub in ("Request", "EngineCoreRequest", "PrefixHashConfig", "KVCacheSpec", "HASH"):
        ns[stub] = object
    ns["tensor_data"] = None
    ns["get_mm_features_in_window"] = None
    load(root, "vllm/utils/hashing.py", ["sha256_cbor"], ns)
    ns["xxhash"] = lambda x: b""
    ns["xxhash_cbor"] = lambda x: b""
    utils = [
        "BlockHash", "ExternalBlockHash", "maybe_convert_block_hash", "NONE_HASH",
        "init_none_hash", "_gen_mm_extra_hash_keys", "_gen_lora_extra_hash_keys",
        "_gen_prompt_embeds_extra_hash_keys", "generate_block_hash_extra_keys",
        "hash_block_tokens", "get_request_block_hasher",
    ]
    if modern:
        utils += ["DEFAULT_NONE_HASH_SEED", "_NON_CRYPTO_HASH_FUNCTIONS", "_NONE_HASH_SEED",
                  "resolve_none_hash_seed", "to_event_extra_keys"]
        load(root, "vllm/v1/token_buffer.py", ["token_slice"], ns)
    else:
        utils += ["_CBOR_HASH_FUNCTIONS"]
    load(root, "vllm/v1/core/kv_cache_utils.py", utils, ns)
    load(root, "vllm/distributed/kv_events.py",
         ["EventBatch", "KVCacheEvent", "BlockStored", "BlockRemoved", "AllBlocksCleared", "KVEventBatch"], ns)
    if modern:
        load(root, "vllm/v1/core/block_pool.py", ["_build_block_stored_event"], ns, within="BlockPool")
    return ns


def fake_request(tokens, lora=None, mm=(), cache_salt=None):
    lora_request = None
    if lora is not None:
        name, path = lora
        lora_request = types.SimpleNamespace(lora_name=name, name=name, lora_path=path, adapter_id=7, lora_int_id=7)
    return types.SimpleNamespace(
        block_hashes=[], num_tokens=len(tokens), all_token_ids=list(tokens), _all_token_ids=list(tokens),
        mm_features=[
            types.SimpleNamespace(identifier=i, mm_position=types.SimpleNamespace(offset=o, length=n))
            for (i, o, n) in mm
        ],
        lora_request=lora_request, cache_salt=cache_salt, prompt_embeds=None,
        _prompt_embeds_per_block_hashes={}, session_id=None,
    )


VLLM_CASES = [
    # name, tokens, block_size, lora, mm, cache_salt
    ("empty", [], 4, None, (), None),
    ("one partial block", [1, 2, 3], 4, None, (), None),
    ("one full block", [1, 2, 3, 4], 4, None, (), None),
    ("three blocks and a tail", list(range(100, 114)), 4, None, (), None),
    ("16-token blocks, wide ids", [0, 23, 24, 255, 256, 65535, 65536, 151643, 2**32 - 1] * 4, 16, None, (), None),
    ("lora", list(range(1, 13)), 4, ("sql-adapter", "/adapters/sql"), (), None),
    ("multimodal across blocks", list(range(1, 17)), 4, None, (("img-0", 2, 7), ("img-1", 11, 2)), None),
    ("cache salt", list(range(1, 9)), 4, None, (), "tenant-a"),
    ("everything", list(range(1, 17)), 4, ("ad", "/p"), (("img", 5, 3),), "s"),
]


def hash_case(ns, name, tokens, block_size, lora, mm, cache_salt, modern):
    request = fake_request(tokens, lora, mm, cache_salt)
    if modern:
        hasher = ns["get_request_block_hasher"](block_size, ns["sha256_cbor"], 0)
    else:
        hasher = ns["get_request_block_hasher"](block_size, ns["sha256_cbor"])
    digests = hasher(request)
    keys = []
    for i in range(len(digests)):
        k, _ = ns["generate_block_hash_extra_keys"](request, i * block_size, (i + 1) * block_size, 0)
        keys.append(None if k is None else cbor2.dumps(k, canonical=True).hex())
    ns["envs"].VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES = True
    ints = [ns["maybe_convert_block_hash"](d) for d in digests]
    return {
        "name": name,
        "block_size": block_size,
        "token_ids": tokens,
        "lora": list(lora) if lora else None,
        "mm": [{"identifier": i, "offset": o, "length": n} for (i, o, n) in mm],
        "cache_salt": cache_salt,
        "extra_keys_cbor": keys,
        "block_hashes": [d.hex() for d in digests],
        "external_ints": ints,
    }


def vllm_hashes(ns, modern: bool, seed: str | None) -> dict:
    if seed is None:
        os.environ.pop("PYTHONHASHSEED", None)
    else:
        os.environ["PYTHONHASHSEED"] = seed
    ns["init_none_hash"](ns["sha256_cbor"])
    cases = [hash_case(ns, *c, modern=modern) for c in VLLM_CASES]
    return {"none_hash_seed": seed if seed is not None else ns["DEFAULT_NONE_HASH_SEED"],
            "none_hash": ns["NONE_HASH"].hex(), "key_style": "tagged" if modern else "untagged", "cases": cases}


# ------------------------------------------------------------------------- SGLang


def compile_native_hash(root: Path, build: Path):
    """Builds hash_binding.cpp the way SGLang's loader does (same flags), minus torch."""
    text, path = read_source(root, "sglang/srt/mem_cache/cpp_utils/hash_binding.cpp")
    import pybind11

    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    out = build / f"hicache_hash_cpp{suffix}"
    flags = ["-O3", "-std=c++17", "-DNDEBUG", "-Wno-deprecated-declarations"]
    with open("/proc/cpuinfo") as f:
        if "avx2" in f.read().lower():
            flags.append("-mavx2")
    subprocess.run(
        ["g++", *flags, "-shared", "-fPIC", "-DTORCH_EXTENSION_NAME=hicache_hash_cpp",
         f"-I{pybind11.get_include()}", f"-I{sysconfig.get_paths()['include']}",
         path, "-o", str(out), "-lcrypto"],
        check=True,
    )
    sys.path.insert(0, str(build))
    import hicache_hash_cpp  # noqa: E402

    return hicache_hash_cpp


def sglang_ns(root: Path, build: Path) -> dict:
    ns = base_ns()
    ns["get_parallel"] = None
    ns["NetworkAddress"] = None
    load(root, "sglang/srt/disaggregation/kv_events.py",
         ["EventBatch", "KVCacheEvent", "StorageMedium", "BlockStored", "BlockRemoved", "AllBlocksCleared",
          "KVEventBatch", "_NAMESPACE_SEED_TAG", "kv_event_namespace_seed", "namespaced_block_hash"], ns)
    module = compile_native_hash(root, build)
    load(root, "sglang/srt/mem_cache/cpp_utils/native_hash.py", ["_native_hash_input", "get_native_hash"], ns)
    ns["_load_native_hash_module"] = lambda: module
    load(root, "sglang/srt/mem_cache/utils.py",
         ["get_hash_str", "storage_namespace_seed", "get_storage_hash_str", "hash_str_to_int64",
          "compute_node_hash_values", "compute_node_event_hash_values"], ns)
    radix_ns = base_ns()
    load(root, "sglang/srt/mem_cache/radix_cache.py", ["RadixKey"], radix_ns)
    ns["RadixKey"] = radix_ns["RadixKey"]
    load(root, "sglang/srt/mem_cache/events.py",
         ["_LORA_ID_LEN", "LoRANameTable", "KvEventLoraNames", "KVCacheEventRecorder"], ns)
    return ns


LORA_ID = "0123456789abcdef0123456789abcdef"

SGLANG_CASES = [
    # name, tokens, page_size, splits (radix node boundaries), cache_salt, lora, dynamo
    ("empty", [], 1, [], None, False, False),
    ("page size 1", [5, 6, 7], 1, [], None, False, False),
    ("one partial page", [1, 2, 3], 4, [], None, False, False),
    ("pages and a tail", list(range(100, 114)), 4, [], None, False, False),
    ("chain across radix nodes", list(range(100, 116)), 4, [8], None, False, False),
    ("wide ids", [0, 23, 255, 256, 65535, 65536, 151643, 2**32 - 1], 4, [], None, False, False),
    ("cache salt", list(range(1, 13)), 4, [4], "tenant-a", False, False),
    ("cache salt, dynamo format", list(range(1, 13)), 4, [], "tenant-a", False, True),
    ("lora", list(range(1, 13)), 4, [4], None, True, False),
    ("lora and salt, dynamo format", list(range(1, 13)), 4, [], "s", True, True),
]


def sglang_tree(ns, tokens, splits, extra_key, cache_salt):
    RadixKey = ns["RadixKey"]
    root = types.SimpleNamespace(key=RadixKey(array("q")), parent=None, hash_value=[], event_hash_value=None)
    nodes, parent, start = [], root, 0
    for end in [*splits, len(tokens)]:
        node = types.SimpleNamespace(
            key=RadixKey(array("q", tokens[start:end]), extra_key=extra_key, cache_salt=cache_salt),
            parent=parent, hash_value=None, event_hash_value=None,
        )
        nodes.append(node)
        parent, start = node, end
    return nodes


def sglang_case(ns, name, tokens, page_size, splits, cache_salt, lora, dynamo):
    names = ns["KvEventLoraNames"]()
    extra_key = None
    if lora:
        extra_key = "user-key" + LORA_ID
        names.register(types.SimpleNamespace(extra_key=extra_key, lora_id=LORA_ID), "sql-adapter")
    recorder = ns["KVCacheEventRecorder"](enabled=True, page_size=page_size, dynamo_format=dynamo, lora_names=names)
    for node in sglang_tree(ns, tokens, splits, extra_key, cache_salt):
        if len(node.key):
            recorder.record_store(node, session_id="sess-1")
    events = recorder.take()
    hashes = [h for e in events for h in e.block_hashes]
    return {
        "name": name,
        "page_size": page_size,
        "token_ids": tokens,
        "cache_salt": cache_salt,
        "namespace_extra_key": extra_key if (lora or dynamo) else None,
        "dynamo_format": dynamo,
        "block_hashes": hashes,
        "unseeded_page_digests": ns["get_hash_str"](tokens, None, page_size=page_size) if tokens else [],
    }, events


# ----------------------------------------------------------------------- messages


def builtin(v):
    """JSON for a decoded field, the form the Rust test builds from its structs."""
    if isinstance(v, bytes):
        return {"bytes": v.hex()}
    if isinstance(v, enum.Enum):
        return v.value
    if isinstance(v, (list, tuple)):
        return [builtin(x) for x in v]
    return v


FIELDS = ["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name",
          "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window", "locality",
          "ownership", "session_id", "lookahead_token_ids", "cache_salt"]
REMOVED_FIELDS = ["block_hashes", "medium", "group_idx", "locality", "ownership"]


def expected_event(e) -> dict:
    kind = type(e).__name__
    fields = {"BlockStored": FIELDS, "BlockRemoved": REMOVED_FIELDS}.get(kind, [])
    out = {"type": kind}
    for f in fields:
        out[f] = builtin(getattr(e, f, None))
    for f in ("block_hashes", "parent_block_hash"):
        if f in out:
            hs = out[f] if isinstance(out[f], list) else [out[f]]
            conv = [h if isinstance(h, dict) or h is None else {"int": h} for h in hs]
            out[f] = conv if isinstance(out[f], list) else conv[0]
    return out


def message(name, engine, ns, batch, seq, topic, rank_field):
    payload = msgspec.msgpack.Encoder().encode(batch)  # ZmqEventPublisher._publisher_thread
    return {
        "name": name,
        "engine": engine,
        "frames": [topic.encode().hex(), seq.to_bytes(8, "big").hex(), payload.hex()],
        "expected": {
            "topic": topic,
            "seq": seq,
            "ts": batch.ts,
            "data_parallel_rank": getattr(batch, rank_field),
            "events": [expected_event(e) for e in batch.events],
        },
    }


def vllm_messages(ns, engine) -> list:
    B = ns
    os.environ.pop("PYTHONHASHSEED", None)  # the engine's default NONE_HASH
    ns["init_none_hash"](ns["sha256_cbor"])
    env = ns["envs"]
    out = []
    req = fake_request(list(range(1, 13)))
    digests = ns["get_request_block_hasher"](4, ns["sha256_cbor"], 0)(req)
    pool = types.SimpleNamespace(medium="GPU")
    env.VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES = True
    conv = ns["maybe_convert_block_hash"]
    stored = ns["_build_block_stored_event"](
        pool, req, block_hashes=[conv(d) for d in digests[1:]], parent_block_hash=conv(digests[0]),
        start_token_idx=4, end_token_idx=12, block_size=4, kv_cache_group_id=0,
        extra_keys_list=[None, None], lookahead_token_ids=None)
    batch = B["KVEventBatch"](ts=1700000000.25, events=[
        stored,
        B["BlockRemoved"](block_hashes=[conv(digests[2])], medium="GPU", group_idx=0),
        B["AllBlocksCleared"](),
    ], data_parallel_rank=0)
    out.append(message("vllm int hashes", engine, ns, batch, 0, "", "data_parallel_rank"))

    env.VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES = False
    req = fake_request(list(range(1, 9)), lora=("sql-adapter", "/adapters/sql"),
                       mm=(("img-0", 2, 3),), cache_salt="tenant-a")
    req.session_id = "sess-9"
    digests = ns["get_request_block_hasher"](4, ns["sha256_cbor"], 0)(req)
    keys = [ns["generate_block_hash_extra_keys"](req, i * 4, i * 4 + 4, 0)[0] for i in range(2)]
    stored = ns["_build_block_stored_event"](
        types.SimpleNamespace(medium="CPU"), req, block_hashes=[conv(d) for d in digests], parent_block_hash=None,
        start_token_idx=0, end_token_idx=8, block_size=4, kv_cache_group_id=1, extra_keys_list=keys,
        lookahead_token_ids=[[9], [10]])
    batch = B["KVEventBatch"](ts=1700000001.5, events=[
        stored,
        B["BlockRemoved"](block_hashes=[conv(d) for d in digests], medium="CPU", group_idx=1, locality="LOCAL"),
    ], data_parallel_rank=3)
    out.append(message("vllm byte hashes, lora, mm, salt", engine, ns, batch, 41, "kv@dp3", "data_parallel_rank"))
    return out + vllm_mock_messages(ns, engine)


# The engine mock's tokenizer (engine/mock/src/tokenizer.rs): the text cut into
# chunks of 4 characters, each chunk's id the first 4 bytes of SHA-256 of its UTF-8,
# big-endian, below 2^31. Its 64-character cache blocks are then vLLM's default
# 16-token blocks.
_FIRST_PROMPT = "user: caf\u00e9 \u4e16\u754c \U0001f980 " + "Hello, world! " * 9 + "\n"
MOCK_PROMPTS = [
    _FIRST_PROMPT,
    _FIRST_PROMPT[:64] + "A different continuation, long enough for two blocks. " * 3 + "\n",
]


def mock_token_ids(text: str) -> list[int]:
    return [int.from_bytes(hashlib.sha256(text[i:i + 4].encode()).digest()[:4], "big") & 0x7FFFFFFF
            for i in range(0, len(text), 4)]


def vllm_mock_messages(ns, engine) -> list:
    """What vLLM 0.34 publishes for the engine mock's two prompts, the second
    sharing the first one's first block, in a cache of 3 blocks: the first prompt's
    2 blocks stored; then the first prompt's second block evicted (its LRU block)
    and the second prompt's 2 new blocks stored after their cached parent. As
    cache_full_blocks and _emit_block_removed_events build them, per request."""
    B = ns
    env = ns["envs"]
    env.VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES = True
    conv = ns["maybe_convert_block_hash"]
    pool = types.SimpleNamespace(medium="GPU")
    first, second = (fake_request(mock_token_ids(p)) for p in MOCK_PROMPTS)
    a = ns["get_request_block_hasher"](16, ns["sha256_cbor"], 0)(first)
    b = ns["get_request_block_hasher"](16, ns["sha256_cbor"], 0)(second)
    assert len(a) == 2 and len(b) == 3 and a[0] == b[0] and a[1] != b[1]

    def stored(req, digests, start, end):
        keys = [ns["generate_block_hash_extra_keys"](req, i * 16, i * 16 + 16, 0)[0] for i in range(start, end)]
        return ns["_build_block_stored_event"](
            pool, req, block_hashes=[conv(d) for d in digests[start:end]],
            parent_block_hash=conv(digests[start - 1]) if start else None,
            start_token_idx=start * 16, end_token_idx=end * 16, block_size=16, kv_cache_group_id=0,
            extra_keys_list=keys, lookahead_token_ids=None)

    out = []
    batch = B["KVEventBatch"](ts=1700000004.5, events=[stored(first, a, 0, 2)], data_parallel_rank=0)
    out.append(message("vllm mock tokens, first prompt", engine, ns, batch, 0, "", "data_parallel_rank"))
    batch = B["KVEventBatch"](ts=1700000005.0, events=[
        B["BlockRemoved"](block_hashes=[conv(a[1])], medium="GPU", group_idx=0),
        stored(second, b, 1, 3),
    ], data_parallel_rank=0)
    out.append(message("vllm mock tokens, second prompt", engine, ns, batch, 1, "", "data_parallel_rank"))
    for m, prompt in zip(out, MOCK_PROMPTS):
        m["mock"] = {"cache_blocks": 3, "block_chars": 64, "prompt": prompt}
    return out


def vllm_legacy_messages(ns, engine) -> list:
    B = ns
    conv = ns["maybe_convert_block_hash"]
    req = fake_request(list(range(1, 9)), lora=("sql-adapter", "/adapters/sql"))
    digests = ns["get_request_block_hasher"](4, ns["sha256_cbor"])(req)
    keys = [ns["generate_block_hash_extra_keys"](req, i * 4, i * 4 + 4, 0)[0] for i in range(2)]
    out = []
    for use_int, rank, seq in ((True, None, 5), (False, 2, 6)):
        ns["envs"].VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES = use_int
        # As BlockPool.cache_full_blocks builds it in 0.20.
        stored = B["BlockStored"](
            block_hashes=[conv(d) for d in digests], parent_block_hash=None, token_ids=req.all_token_ids,
            block_size=4, lora_id=7, medium="GPU", lora_name="sql-adapter", extra_keys=keys, group_idx=0)
        batch = B["KVEventBatch"](ts=1699999999.0, events=[
            stored, B["BlockRemoved"](block_hashes=[conv(digests[1])], medium="GPU"), B["AllBlocksCleared"]()],
            data_parallel_rank=rank)
        kind = "int" if use_int else "byte"
        out.append(message(f"vllm positional events, {kind} hashes", engine, ns, batch, seq, "", "data_parallel_rank"))
    return out


def sglang_messages(ns, engine) -> list:
    B = ns
    out = []
    recorder = ns["KVCacheEventRecorder"](enabled=True, page_size=4)
    nodes = sglang_tree(ns, list(range(100, 116)), [8], None, None)
    for n in nodes:
        recorder.record_store(n)
    recorder.record_remove(nodes[1])
    recorder.record_store(nodes[1], medium=ns["StorageMedium"].CPU)
    recorder.record_all_cleared()
    batch = B["KVEventBatch"](ts=1700000002.75, events=recorder.take())
    batch.attn_dp_rank = 0  # ZmqEventPublisher.publish fills it in
    out.append(message("sglang store, remove, clear", engine, ns, batch, 0, "", "attn_dp_rank"))

    _, salted = sglang_case(ns, "m", list(range(1, 9)), 4, [], "tenant-a", False, False)
    bigram = ns["KVCacheEventRecorder"](enabled=True, page_size=2)
    RadixKey = ns["RadixKey"]
    root = types.SimpleNamespace(key=RadixKey(array("q")), parent=None, hash_value=[], event_hash_value=None)
    node = types.SimpleNamespace(key=RadixKey(array("q", [7, 8, 9, 10, 11]), is_bigram=True), parent=root,
                                 hash_value=None, event_hash_value=None)
    bigram.record_store(node)
    batch = B["KVEventBatch"](ts=1700000003.0, events=salted + bigram.take(), attn_dp_rank=None)
    out.append(message("sglang salted and bigram pages, nil rank", engine, ns, batch, 2**40, "sglang", "attn_dp_rank"))
    return out


def sglang_legacy_messages(root: Path, engine) -> list:
    ns = base_ns()
    load(root, "sglang/srt/disaggregation/kv_events.py",
         ["EventBatch", "KVCacheEvent", "BlockStored", "BlockRemoved", "AllBlocksCleared", "KVEventBatch"], ns)
    pages = [[1, 2, 3, 4], [5, 6, 7, 8]]
    # As RadixCache._record_store_event builds them in 0.5.2: Python's hash() of the page.
    hashes = [hash(tuple(p)) for p in pages]
    events = [
        ns["BlockStored"](block_hashes=[hashes[0]], parent_block_hash=None, token_ids=pages[0], block_size=4, lora_id=None),
        ns["BlockStored"](block_hashes=[hashes[1]], parent_block_hash=hashes[0], token_ids=pages[1], block_size=4, lora_id=None),
        ns["BlockRemoved"](block_hashes=[-(2**63), 2**63 - 1]),
        ns["AllBlocksCleared"](),
    ]
    batch = ns["KVEventBatch"](ts=1690000000.0, events=events, attn_dp_rank=1)
    return [message("sglang positional events", engine, ns, batch, 3, "", "attn_dp_rank")]


# --------------------------------------------------------------------------- CBOR


def cbor_vectors() -> list:
    values = [
        None, True, False, 0, 1, 23, 24, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**64 - 1, 2**64, 2**100,
        -1, -24, -25, -256, -257, -(2**64), -(2**64) - 1, -(2**100),
        "", "a", "vllm-none-hash", "ü€𝄞", "x" * 24, "y" * 300,
        b"", b"\x00", bytes(range(32)), bytes(300),
        (), (1, "a", b"b", None), (("lora", "n", "/p"), ("mm", "id", -3)), tuple(range(30)),
    ]

    def describe(v):
        if v is None or isinstance(v, bool):
            return v
        if isinstance(v, int):
            return {"int": str(v)}
        if isinstance(v, str):
            return {"text": v}
        if isinstance(v, bytes):
            return {"bytes": v.hex()}
        return {"array": [describe(x) for x in v]}

    return [{"value": describe(v), "cbor": cbor2.dumps(v, canonical=True).hex()} for v in values]


def to_json(v, indent: str = "") -> str:
    """Indented JSON with lists of scalars kept on one line, so the files read as
    a table of cases rather than a column of numbers."""
    inner = indent + "  "
    if isinstance(v, dict) and v:
        items = [f"{inner}{json.dumps(k)}: {to_json(x, inner)}" for k, x in v.items()]
        return "{\n" + ",\n".join(items) + "\n" + indent + "}"
    if isinstance(v, list) and any(isinstance(x, (dict, list)) for x in v):
        return "[\n" + ",\n".join(inner + to_json(x, inner) for x in v) + "\n" + indent + "]"
    return json.dumps(v, ensure_ascii=False)


def write(out: Path, name: str, data) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / name).write_text(to_json(data) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vllm", type=Path, required=True, help="unpacked vLLM 0.34 wheel (has vllm/)")
    ap.add_argument("--vllm-legacy", type=Path, required=True, help="unpacked vLLM 0.20 wheel")
    ap.add_argument("--sglang", type=Path, required=True, help="unpacked SGLang 0.5.23 wheel (has sglang/)")
    ap.add_argument("--sglang-legacy", type=Path, required=True, help="unpacked SGLang 0.5.2 wheel")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent)
    args = ap.parse_args()

    tools = {"python": sys.version.split()[0], "cbor2": version("cbor2"), "msgspec": msgspec.__version__}
    vllm_src, legacy_src = version_of(args.vllm, "vllm"), version_of(args.vllm_legacy, "vllm")
    sglang_src, sglang_legacy_src = version_of(args.sglang, "sglang"), version_of(args.sglang_legacy, "sglang")

    SOURCES.clear()
    RELEASE["name"] = f"vllm {vllm_src['version']}"
    modern = vllm_ns(args.vllm, modern=True)
    RELEASE["name"] = f"vllm {legacy_src['version']}"
    legacy = vllm_ns(args.vllm_legacy, modern=False)
    vllm = {
        "engines": {"current": vllm_src, "legacy": legacy_src},
        "current": vllm_hashes(modern, True, None),
        "current_with_pythonhashseed": vllm_hashes(modern, True, "12345"),
        "legacy_with_pythonhashseed": vllm_hashes(legacy, False, "12345"),
    }
    vllm_msgs = vllm_messages(modern, f"vllm {vllm_src['version']}") + vllm_legacy_messages(
        legacy, f"vllm {legacy_src['version']}")
    vllm["sources"] = list(SOURCES)
    vllm["tools"] = tools

    SOURCES.clear()
    RELEASE["name"] = f"sglang {sglang_src['version']}"
    with tempfile.TemporaryDirectory() as build:
        sg = sglang_ns(args.sglang, Path(build))
        sglang = {
            "engine": sglang_src,
            "cases": [sglang_case(sg, *c)[0] for c in SGLANG_CASES],
        }
        sglang_msgs = sglang_messages(sg, f"sglang {sglang_src['version']}")
    RELEASE["name"] = f"sglang {sglang_legacy_src['version']}"
    sglang_msgs += sglang_legacy_messages(args.sglang_legacy, f"sglang {sglang_legacy_src['version']}")
    sglang["sources"] = list(SOURCES)
    sglang["tools"] = tools | {"pybind11": version("pybind11")}

    write(args.out, "vllm_hashes.json", vllm)
    write(args.out, "sglang_hashes.json", sglang)
    write(args.out, "messages.json", {"tools": tools, "messages": vllm_msgs + sglang_msgs})
    write(args.out, "cbor.json", {"tools": tools, "values": cbor_vectors()})


def version(dist: str) -> str:
    from importlib.metadata import version as v

    return v(dist)


if __name__ == "__main__":
    main()
