//! Whether the `OTEL_*` variables ask for traces, and for traces pgoutbox can export. The
//! sampler, the resource, the exporter's headers and compression and the batch queue are
//! read from the same variables by the OpenTelemetry SDK itself.

use std::path::PathBuf;
use std::time::Duration;

use crate::settings::config::Env;

/// Traces are configured, and pgoutbox can export them.
#[derive(Debug, PartialEq, Eq)]
pub struct TraceSettings {
    /// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, or `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub endpoint: String,
    /// How long one export may take (`OTEL_EXPORTER_OTLP_[TRACES_]TIMEOUT`, milliseconds).
    pub timeout: Duration,
    /// An `https://` endpoint's CA (`OTEL_EXPORTER_OTLP_[TRACES_]CERTIFICATE`, PEM); the
    /// system's roots when not given.
    pub certificate: Option<PathBuf>,
    /// Neither `OTEL_SERVICE_NAME` nor `OTEL_RESOURCE_ATTRIBUTES` names the service: it is
    /// `pgoutbox`, not the SDK's `unknown_service`.
    pub default_service_name: bool,
}

/// Traces were asked for in a way pgoutbox does not export: said once, and streaming goes
/// on without them.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error(
        "{0}: pgoutbox exports traces over OTLP http/protobuf only; unset it or set \
         http/protobuf, with the collector's HTTP endpoint (port 4318)"
    )]
    Protocol(String),
    #[error("{0}: the endpoint must be an http:// or https:// URL (http://<host>:4318)")]
    Scheme(String),
    #[error("OTEL_TRACES_EXPORTER={0}: pgoutbox exports traces over OTLP only (otlp or none)")]
    Exporter(String),
}

const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

impl TraceSettings {
    /// `Ok(None)`: no traces asked for (no endpoint, `OTEL_SDK_DISABLED=true` or
    /// `OTEL_TRACES_EXPORTER=none`).
    pub fn from_env(env: &dyn Env) -> Result<Option<TraceSettings>, Refusal> {
        let var = |name: &str| env.var(name).map(|v| v.trim().to_owned()).filter(|v| !v.is_empty());
        let first = |names: [&'static str; 2]| {
            names.into_iter().find_map(|name| var(name).map(|value| (name, value)))
        };
        if var("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        match var("OTEL_TRACES_EXPORTER") {
            Some(exporter) if exporter == "none" => return Ok(None),
            Some(exporter) if exporter != "otlp" => return Err(Refusal::Exporter(exporter)),
            _ => {}
        }
        let endpoints = ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"];
        let Some((name, endpoint)) = first(endpoints) else {
            return Ok(None);
        };
        let protocols = ["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"];
        if let Some((protocol_name, protocol)) = first(protocols)
            && protocol != "http/protobuf"
        {
            return Err(Refusal::Protocol(format!("{protocol_name}={protocol}")));
        }
        let scheme = endpoint.split_once("://").map(|(scheme, _)| scheme.to_ascii_lowercase());
        if !matches!(scheme.as_deref(), Some("http" | "https")) {
            return Err(Refusal::Scheme(format!("{name}={}", shown(&endpoint))));
        }
        let certificates =
            ["OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", "OTEL_EXPORTER_OTLP_CERTIFICATE"];
        let certificate = first(certificates).map(|(_, path)| PathBuf::from(path));
        let timeouts = ["OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT"];
        let timeout = first(timeouts)
            .and_then(|(_, ms)| ms.parse().ok())
            .map_or(DEFAULT_TIMEOUT, Duration::from_millis);
        let names_service = var("OTEL_RESOURCE_ATTRIBUTES").is_some_and(|attributes| {
            attributes
                .split(',')
                .any(|pair| pair.split('=').next().map(str::trim) == Some("service.name"))
        });
        let default_service_name = var("OTEL_SERVICE_NAME").is_none() && !names_service;
        Ok(Some(TraceSettings { endpoint, timeout, certificate, default_service_name }))
    }
}

/// `url` as it may be logged: without a `user:password@` (OTLP collectors take basic
/// authentication in the endpoint).
pub fn shown(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_owned() };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    match rest[..authority_end].rsplit_once('@') {
        Some((_, host)) => format!("{scheme}://***@{host}{}", &rest[authority_end..]),
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    #[test]
    fn an_endpoints_credentials_are_never_shown() {
        assert_eq!(
            shown("https://u:p%40ss@otel.example:4318/v1"),
            "https://***@otel.example:4318/v1"
        );
        assert_eq!(shown("http://otel:4318"), "http://otel:4318");
        assert_eq!(shown("http://otel:4318/a@b"), "http://otel:4318/a@b");
    }

    struct Vars(HashMap<&'static str, &'static str>);

    impl Env for Vars {
        fn var(&self, name: &str) -> Option<String> {
            self.0.get(name).map(|v| v.to_string())
        }
    }

    fn settings(vars: &[(&'static str, &'static str)]) -> Result<Option<TraceSettings>, Refusal> {
        TraceSettings::from_env(&Vars(vars.iter().copied().collect()))
    }

    const ENDPOINT: (&str, &str) = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318");

    #[test]
    fn off_unless_an_endpoint_is_set_and_the_sdk_not_disabled() {
        assert_eq!(settings(&[]), Ok(None));
        assert_eq!(settings(&[("OTEL_SERVICE_NAME", "x")]), Ok(None));
        assert_eq!(settings(&[ENDPOINT, ("OTEL_SDK_DISABLED", "TRUE")]), Ok(None));
        assert_eq!(settings(&[ENDPOINT, ("OTEL_TRACES_EXPORTER", "none")]), Ok(None));
        let on = settings(&[ENDPOINT, ("OTEL_SDK_DISABLED", "false")]).unwrap().unwrap();
        assert_eq!(on.endpoint, "http://collector:4318");
        assert_eq!(on.timeout, DEFAULT_TIMEOUT);
        assert!(on.default_service_name);
    }

    #[test]
    fn the_traces_variables_come_before_the_general_ones() {
        let on = settings(&[
            ENDPOINT,
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://traces:4318/v1/traces"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "500"),
        ]);
        let on = on.unwrap().unwrap();
        assert_eq!(on.endpoint, "http://traces:4318/v1/traces");
        assert_eq!(on.timeout, Duration::from_millis(500));
    }

    #[test]
    fn what_pgoutbox_cannot_export_is_refused_with_the_variable_named() {
        let grpc = settings(&[ENDPOINT, ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")]).unwrap_err();
        assert!(grpc.to_string().starts_with("OTEL_EXPORTER_OTLP_PROTOCOL=grpc: "), "{grpc}");
        let https = settings(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "https://c:4318")]);
        assert!(matches!(https, Ok(Some(TraceSettings { certificate: None, .. }))), "{https:?}");
        let ca = ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/etc/ca.pem");
        let https = settings(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "https://c:4318"), ca]);
        let certificate = https.ok().flatten().and_then(|on| on.certificate);
        assert_eq!(certificate, Some(PathBuf::from("/etc/ca.pem")));
        let unix = settings(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "unix:///run/otel.sock")]);
        assert!(matches!(unix, Err(Refusal::Scheme(_))));
        let zipkin = settings(&[ENDPOINT, ("OTEL_TRACES_EXPORTER", "zipkin")]);
        assert_eq!(zipkin, Err(Refusal::Exporter("zipkin".into())));
    }

    #[test]
    fn the_service_is_pgoutbox_unless_named() {
        let named = |vars: &[(&'static str, &'static str)]| {
            !settings(vars).unwrap().unwrap().default_service_name
        };
        assert!(named(&[ENDPOINT, ("OTEL_SERVICE_NAME", "relay")]));
        assert!(named(&[ENDPOINT, ("OTEL_RESOURCE_ATTRIBUTES", "a=b, service.name=relay")]));
        assert!(!named(&[ENDPOINT, ("OTEL_RESOURCE_ATTRIBUTES", "service.namespace=x")]));
    }
}
