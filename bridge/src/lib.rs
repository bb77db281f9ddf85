//! `llm-bridge`: one per Envoy replica, beside it. The filter cannot open sockets,
//! so this process carries the replica's routing operations to its peers over NATS
//! core pub/sub and theirs back in, through the filter's authenticated replicas
//! endpoint on the loopback listener (`llm_router::background::replica`):
//!
//! - export: every `--poll-ms` it asks the filter for its own inserts since its
//!   cursor (`GET ?after=SEQ`) and publishes the batch, sealed, on `<prefix>.ops`
//!   (a batch with no operations is still published every `--load-ms`: it carries
//!   the replica's in-flight counts). The cursor moves only once the batch is
//!   published, so while the bus is down the operations wait in the ring (bounded:
//!   the filter counts what it overwrites) and go out when the bus returns.
//! - import: every peer batch on `<prefix>.ops` that passes the fleet gate is
//!   posted to the filter (`POST ?replica=ID`), in arrival order.
//! - catch-up: on every (re)connection the bridge asks its peers on
//!   `<prefix>.catchup` for what they published recently (each keeps its last
//!   `--retain-bytes` of batches) and posts their answers as replays (operations
//!   only: their in-flight counts are history). A replica that joins late, or was
//!   cut off, so learns the fleet's recent prefixes; with no peer answering it starts
//!   clean. None of this is in the request path: the filter routes on whatever it has.
//! - the fleet boundary: every message travels sealed under the fleet key and
//!   stamped (`envelope`); what arrives is admitted only if authentic, of its
//!   subject's kind, fresh and new (`fleet`, `replay`), and every refusal is
//!   counted. NATS's own authentication and TLS (`bus`) keep outsiders off the bus
//!   in the first place.
//!
//! NATS core rather than JetStream: routing state is advisory and bounded, so
//! at-most-once delivery plus catch-up from peers is enough, and a bus that stores
//! nothing has nothing to repair after an outage.

pub mod bus;
pub mod cli;
pub mod envelope;
pub mod envoy;
pub mod fleet;
pub mod replay;
pub mod retained;
pub mod run;
pub mod stats;
