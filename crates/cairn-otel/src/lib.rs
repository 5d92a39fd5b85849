//! Cairn's runs as OpenTelemetry traces.
//!
//! A run's trace is built from its event log, never from live
//! instrumentation: one span per run, per node attempt, per model call and
//! per tool call, with the contract's fields as attributes
//! ([`build_spans`], pure). Ids are hashes of what a span is
//! ([`trace_id`], [`span_id`]), so a run resumed after a crash is one trace,
//! a child run hangs from the parent's attempt that started it in the same
//! trace, and exporting twice sends the same ids.
//!
//! The spans go to a collector over OTLP/HTTP with protobuf bodies
//! ([`OtlpClient`]), configured by OpenTelemetry's standard environment
//! variables ([`OtlpConfig::from_env`]); with none set, nothing is
//! exported. [`TraceExporter`] does it in the background, for a process
//! that drives runs: whatever fails is logged and never reaches a run.
//!
//! See docs/otel.md for the span names and attributes.

mod config;
mod export;
mod ids;
mod read;
mod spans;
mod worker;

pub use config::{
    resource_from_env, ConfigError, OtlpConfig, DEFAULT_SERVICE_NAME, DEFAULT_TIMEOUT, PROTOCOL,
};
pub use export::{requests, to_json, ExportError, OtlpClient, MAX_SPANS_PER_REQUEST};
pub use ids::{span_id, trace_id, SpanKey};
pub use read::{lineage, run_spans, visit_tree, RunReader, MAX_ANCESTORS, MAX_TREE_RUNS};
pub use spans::{
    build_spans, Lineage, ParentSpan, TraceBuilder, MAX_ATTRIBUTE_LEN, MAX_EVENTS_PER_SPAN,
    MAX_SPANS_PER_RUN,
};
pub use worker::{ErrorHook, TraceExporter, QUEUE_CAPACITY};

/// The OTLP message types, for code that reads what this crate sends.
pub use opentelemetry_proto::tonic as proto;
