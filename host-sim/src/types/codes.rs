//! Constants of the proxy-wasm ABI 0.2.1, as in the SDK's `types.rs`: the status codes
//! returned to the guest, log levels, and the buffer, map, stream and metric type codes
//! the guest passes in. Plain values: this module imports nothing from the crate.

/// Status codes returned to the guest (`WasmResult` in Envoy).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub enum Status {
    /// Success.
    Ok = 0,
    /// Key, queue, token, metric, property, function... not found.
    NotFound = 1,
    /// Argument rejected (unknown cluster, unavailable map, bad shape...).
    BadArgument = 2,
    /// A value could not be serialized.
    SerializationFailure = 3,
    /// A value could not be parsed.
    ParseFailure = 4,
    /// Queue empty.
    Empty = 7,
    /// Shared-data compare-and-swap mismatch.
    CasMismatch = 8,
    /// Host-side failure.
    InternalFailure = 10,
    /// The connection of an HTTP call broke.
    BrokenConnection = 11,
    /// Not implemented by this host.
    Unimplemented = 12,
}

impl Status {
    /// The value handed back to the guest.
    pub fn code(self) -> i32 {
        self as i32
    }
}

/// Log levels (`LogLevel` in the SDK).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    /// 0
    Trace,
    /// 1
    Debug,
    /// 2
    Info,
    /// 3
    Warn,
    /// 4
    Error,
    /// 5
    Critical,
}

impl LogLevel {
    /// From the ABI value; `None` when out of range.
    pub fn from_raw(v: i32) -> Option<Self> {
        Some(match v {
            0 => Self::Trace,
            1 => Self::Debug,
            2 => Self::Info,
            3 => Self::Warn,
            4 => Self::Error,
            5 => Self::Critical,
            _ => return None,
        })
    }

    /// The ABI value.
    pub fn raw(self) -> i32 {
        self as i32
    }
}

/// `BufferType` values.
pub mod buffer {
    pub const HTTP_REQUEST_BODY: i32 = 0;
    pub const HTTP_RESPONSE_BODY: i32 = 1;
    pub const DOWNSTREAM_DATA: i32 = 2;
    pub const UPSTREAM_DATA: i32 = 3;
    pub const HTTP_CALL_RESPONSE_BODY: i32 = 4;
    pub const GRPC_RECEIVE_BUFFER: i32 = 5;
    pub const VM_CONFIGURATION: i32 = 6;
    pub const PLUGIN_CONFIGURATION: i32 = 7;
    pub const CALL_DATA: i32 = 8;
}

/// `MapType` values.
pub mod map {
    pub const HTTP_REQUEST_HEADERS: i32 = 0;
    pub const HTTP_REQUEST_TRAILERS: i32 = 1;
    pub const HTTP_RESPONSE_HEADERS: i32 = 2;
    pub const HTTP_RESPONSE_TRAILERS: i32 = 3;
    pub const GRPC_RECEIVE_INITIAL_METADATA: i32 = 4;
    pub const GRPC_RECEIVE_TRAILING_METADATA: i32 = 5;
    pub const HTTP_CALL_RESPONSE_HEADERS: i32 = 6;
    pub const HTTP_CALL_RESPONSE_TRAILERS: i32 = 7;
}

/// `StreamType` values.
pub mod stream {
    pub const HTTP_REQUEST: i32 = 0;
    pub const HTTP_RESPONSE: i32 = 1;
    pub const DOWNSTREAM: i32 = 2;
    pub const UPSTREAM: i32 = 3;
}

/// `MetricType` values.
pub mod metric {
    pub const COUNTER: i32 = 0;
    pub const GAUGE: i32 = 1;
    pub const HISTOGRAM: i32 = 2;
}
