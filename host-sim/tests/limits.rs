//! Bounded work per request under Envoy's memory cap: host-sim caps each VM's linear
//! memory at 1 GiB as Envoy does, so a body that makes the filter allocate past it
//! traps here as it does in Envoy.

mod support;

use host_sim::RequestSpec;
use support::{build, builder, fleet_clusters, fleet_config};

/// A chat message whose content is `[0,0,...]`, of about `mb` megabytes: millions
/// of tiny JSON values in a valid body (numbers in `messages` itself are refused at
/// the first: `health.rs`).
fn numbers_body(mb: usize) -> Vec<u8> {
    let n = mb * 1024 * 1024 / 2;
    let mut b = Vec::with_capacity(n * 2 + 48);
    b.extend_from_slice(br#"{"messages":[{"role":"user","content":["#);
    for i in 0..n {
        if i > 0 {
            b.push(b',');
        }
        b.push(b'0');
    }
    b.extend_from_slice(b"]}]}");
    b
}

/// Envoy 1.40 reloaded the VM on an 18 MB body of numbers (the filter built a
/// `serde_json::Value` per number and ran out of its 1 GiB); a body up to the shipped
/// 64 MiB buffer limit is now routed (with `max_body_bytes` raised to it), and the
/// VM keeps serving.
#[test]
fn bodies_of_millions_of_numbers_are_routed_without_a_trap() {
    let config = fleet_config(4, r#","max_body_bytes":67108864"#);
    let mut host = build(builder(&config, 1, 1, &fleet_clusters(4)), &config);
    for mb in [18, 60] {
        let out = host
            .vm(0)
            .request(RequestSpec {
                body_chunks: 8,
                ..RequestSpec::post_json("/v1/chat/completions", numbers_body(mb))
            })
            .unwrap_or_else(|e| panic!("{mb} MB: the filter trapped: {e:#}"));
        assert!(out.continued, "{mb} MB routed: {out:?}");
        host.vm(0).finish(out.handle).expect("the stream ends");
    }
    let (_, ok) = support::route_completion(&mut host, 0, "the VM still routes");
    assert!(ok.is_some(), "a normal request after them is routed");
}

/// The cap is real: a guest that must allocate past it traps (here a 16 MB cap and a
/// 20 MB body the filter copies into its memory). Without the cap, wasmtime would let
/// a VM grow to 4 GiB and the 18 MB case above would never have trapped.
#[test]
fn the_vm_memory_is_capped_like_envoys() {
    let config = fleet_config(1, "");
    let mut host = build(
        builder(&config, 1, 1, &fleet_clusters(1)).max_memory(16 << 20),
        &config,
    );
    let out = host.vm(0).request(RequestSpec {
        headers: vec![
            (":method", "POST"),
            (":path", "/v1/completions"),
            (":authority", "x"),
        ],
        body: format!(r#"{{"prompt":"{}"}}"#, "x".repeat(20 << 20)).into_bytes(),
        body_chunks: 4,
    });
    assert!(out.is_err(), "a 20 MB body cannot fit a 16 MB VM: {out:?}");
}

/// In PD mode the same body is also rewritten with the bootstrap fields for both
/// engines: the rewrite copies the client's values through as text, so a body of
/// millions of numbers is rewritten and sent to both, where building JSON values of
/// it ran the VM out of its 1 GiB.
#[test]
fn pd_rewrites_bodies_of_millions_of_numbers_without_a_trap() {
    let config = r#"{"max_body_bytes":67108864,"workers":[
        {"name":"p0","pool":"prefill","cluster":"prefill_0","address":"10.0.0.1:30000","bootstrap_port":8998},
        {"name":"d0","pool":"decode","cluster":"decode_0"}]}"#;
    let mut host = build(builder(config, 1, 1, &["prefill_0", "decode_0"]), config);
    let body = numbers_body(60);
    let out = host
        .vm(0)
        .request(RequestSpec {
            body_chunks: 8,
            ..RequestSpec::post_json("/v1/chat/completions", body.clone())
        })
        .unwrap_or_else(|e| panic!("the filter trapped: {e:#}"));
    assert!(out.continued, "routed: {:?}", out.local_response);
    let [call] = out.http_calls.as_slice() else {
        panic!("one prefill copy: {:?}", out.http_calls.len());
    };
    assert_eq!(
        call.body, out.request_body,
        "both engines get the same body"
    );
    let tail = b"],\"bootstrap_host\":\"10.0.0.1\",\"bootstrap_port\":8998,\"bootstrap_room\":";
    assert_eq!(
        out.request_body.get(..body.len() - 2),
        body.get(..body.len() - 2),
        "the client's members are copied through as sent"
    );
    assert!(
        out.request_body
            .get(body.len() - 2..)
            .is_some_and(|t| t.starts_with(tail)),
        "the bootstrap fields follow them"
    );
}
