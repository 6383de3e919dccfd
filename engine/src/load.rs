//! An engine's load from the text of its Prometheus endpoint: requests running and waiting,
//! and KV-cache usage, read by exact name per engine family; requests are summed and usage
//! averaged over the label sets the engine exports (vLLM: one per engine core, labels
//! `model_name` and `engine`; SGLang: one per dp rank).
//!
//! | family | running | waiting | KV-cache usage (0..=1) |
//! | --- | --- | --- | --- |
//! | vLLM | `vllm:num_requests_running` | `vllm:num_requests_waiting` | `vllm:kv_cache_usage_perc` |
//! | SGLang | `sglang:num_running_reqs` | `sglang:num_queue_reqs` | `sglang:token_usage` |
//!
//! The names are those vLLM 0.33.0 (`vllm/v1/metrics/loggers.py`) and SGLang 0.5.23
//! (`sglang/srt/observability/metrics_collector.py`) register. A usage above 1 is read as 1.
//!
//! The text is parsed by the `prom_text_format_parser` crate, not by `prometheus-parse` (which
//! reads the services' own metrics elsewhere): the latter drops every sample whose name holds a
//! colon, as all of these do.

use ckf_core::route::EngineLoad;
use thiserror::Error;

/// Which engine exports the metrics (`vllm`, `sglang` in configuration).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "lowercase")
)]
pub enum EngineFamily {
    /// vLLM (the default).
    #[default]
    Vllm,
    /// SGLang.
    Sglang,
}

impl std::str::FromStr for EngineFamily {
    type Err = String;

    /// `vllm` or `sglang`.
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "vllm" => Ok(Self::Vllm),
            "sglang" => Ok(Self::Sglang),
            _ => Err(format!("'{s}' is not an engine family (vllm, sglang)")),
        }
    }
}

impl EngineFamily {
    /// The metric names of running requests, waiting requests and KV-cache usage.
    pub fn metric_names(self) -> [&'static str; 3] {
        match self {
            Self::Vllm => [
                "vllm:num_requests_running",
                "vllm:num_requests_waiting",
                "vllm:kv_cache_usage_perc",
            ],
            Self::Sglang => [
                "sglang:num_running_reqs",
                "sglang:num_queue_reqs",
                "sglang:token_usage",
            ],
        }
    }
}

/// Why no load could be read.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum LoadError {
    /// The text is not Prometheus text.
    #[error("not Prometheus text: {0}")]
    Parse(String),
    /// A metric the family exports is absent (or has no sample).
    #[error("no {0} in the metrics")]
    Missing(&'static str),
    /// A sample's value is not a finite number at least 0.
    #[error("{0} has the value {1}")]
    Value(&'static str, String),
}

impl LoadError {
    /// A short stable label for metrics: `"parse"`, `"missing"`, `"value"`.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Parse(_) => "parse",
            Self::Missing(_) => "missing",
            Self::Value(..) => "value",
        }
    }
}

/// At most this many characters of a parse error are kept (it may echo a whole line of a
/// hostile or broken body).
const MAX_SHOWN: usize = 200;

fn shown(text: &str) -> String {
    match text.char_indices().nth(MAX_SHOWN) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text.to_owned(),
    }
}

/// The load `family`'s metrics in `text` show.
///
/// # Errors
/// [`LoadError`] when the text does not parse or a metric is missing or not a finite,
/// non-negative number: the engine's load is then unknown, never zero.
pub fn read_load(family: EngineFamily, text: &str) -> Result<EngineLoad, LoadError> {
    let scrape = prom_text_format_parser::Scrape::parse(text)
        .map_err(|e| LoadError::Parse(shown(&format!("{e:?}"))))?;
    let values = |name: &'static str| -> Result<Vec<f64>, LoadError> {
        let mut values = Vec::new();
        for metric in scrape.metrics.iter().filter(|m| m.name == name) {
            for sample in &metric.samples {
                let v = sample.value.value.as_f64();
                if !v.is_finite() || v < 0.0 {
                    return Err(LoadError::Value(name, v.to_string()));
                }
                values.push(v);
            }
        }
        if values.is_empty() {
            return Err(LoadError::Missing(name));
        }
        Ok(values)
    };
    let [running, waiting, usage] = family.metric_names();
    let count = |name| -> Result<u32, LoadError> {
        let sum: f64 = values(name)?.iter().sum();
        // Requests are whole; a gauge of a multi-process engine may sum to a fraction.
        Ok(sum.round().min(f64::from(u32::MAX)) as u32)
    };
    let (running, waiting) = (count(running)?, count(waiting)?);
    let usage = values(usage)?;
    Ok(EngineLoad {
        running,
        waiting,
        kv_usage: (usage.iter().sum::<f64>() / usage.len() as f64).min(1.0),
    })
}

#[cfg(test)]
mod tests;
