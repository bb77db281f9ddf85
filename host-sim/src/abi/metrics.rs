//! Metrics, as Envoy's stats store keeps them: `wasmcustom.NAME`, one value per name
//! over all VMs; ids are per VM, the low two bits are the type. Counters only go up
//! (an increment must be > 0), gauges saturate at 0.

use super::{st, C};
use crate::hostcall::{Guest, Registry};
use crate::state::{lock, HostState};
use crate::types::codes::{self, Status};
use crate::types::values::MetricValue;
use wasmtime::Result;

/// Registers the metric hostcalls.
pub(super) fn register(r: &mut Registry<HostState>) -> Result<()> {
    r.wrap(
        "proxy_define_metric",
        |mut c: C, kind: i32, ptr: i32, len: i32, id_ptr: i32| {
            let mut g = Guest::new(&mut c);
            let name = format!("wasmcustom.{}", g.read_string(ptr, len)?);
            let initial = match kind {
                codes::metric::COUNTER => MetricValue::Counter(0),
                codes::metric::GAUGE => MetricValue::Gauge(0),
                codes::metric::HISTOGRAM => MetricValue::Histogram(Vec::new()),
                _ => return st(Status::BadArgument),
            };
            let s = g.state();
            // Envoy's ids: the low two bits are the type, then steps of 4.
            let id = s.next_metric_id[kind as usize];
            s.next_metric_id[kind as usize] = id.wrapping_add(4);
            lock(&s.shared)
                .metrics
                .entry(name.clone())
                .or_insert(initial);
            s.metric_ids.insert(id, name);
            g.write_u32(id_ptr, id)?;
            st(Status::Ok)
        },
    )?;
    r.wrap("proxy_get_metric", |mut c: C, id: i32, ptr: i32| {
        let mut g = Guest::new(&mut c);
        let id = id as u32;
        if id & 3 > 1 {
            return st(Status::BadArgument);
        }
        let s = g.state();
        let value =
            s.metric_ids
                .get(&id)
                .and_then(|name| match lock(&s.shared).metrics.get(name) {
                    Some(MetricValue::Counter(v) | MetricValue::Gauge(v)) => Some(*v),
                    _ => None,
                });
        let Some(value) = value else {
            return st(Status::NotFound);
        };
        g.write_u64(ptr, value)?;
        st(Status::Ok)
    })?;
    r.wrap("proxy_record_metric", |mut c: C, id: i32, value: i64| {
        let s = c.data_mut();
        let Some(name) = s.metric_ids.get(&(id as u32)) else {
            return st(Status::NotFound);
        };
        let value = value as u64;
        match lock(&s.shared).metrics.get_mut(name) {
            Some(MetricValue::Counter(v)) => *v = v.wrapping_add(value),
            Some(MetricValue::Gauge(v)) => *v = value,
            Some(MetricValue::Histogram(values)) => values.push(value),
            None => return st(Status::NotFound),
        }
        st(Status::Ok)
    })?;
    r.wrap(
        "proxy_increment_metric",
        |mut c: C, id: i32, offset: i64| {
            let s = c.data_mut();
            let id = id as u32;
            if id & 3 > 1 {
                return st(Status::BadArgument);
            }
            let Some(name) = s.metric_ids.get(&id) else {
                return st(Status::NotFound);
            };
            match lock(&s.shared).metrics.get_mut(name) {
                Some(MetricValue::Counter(_)) if offset <= 0 => return st(Status::BadArgument),
                Some(MetricValue::Counter(v)) => *v = v.wrapping_add(offset as u64),
                Some(MetricValue::Gauge(v)) if offset >= 0 => *v = v.saturating_add(offset as u64),
                Some(MetricValue::Gauge(v)) => *v = v.saturating_sub(offset.unsigned_abs()),
                _ => return st(Status::NotFound),
            }
            st(Status::Ok)
        },
    )?;
    Ok(())
}
