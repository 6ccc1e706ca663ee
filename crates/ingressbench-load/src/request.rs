//! The request, rendered to bytes once and written as is for every request.

use crate::{LoadError, Target};

/// What to send.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RequestSpec {
    /// Method (`GET`, `POST`, …).
    pub method: String,
    /// Extra headers, in order; a `Host` header replaces the URL's authority.
    pub headers: Vec<(String, String)>,
    /// Body (empty for none).
    pub body: Vec<u8>,
}

impl Default for RequestSpec {
    fn default() -> Self {
        Self {
            method: "GET".to_owned(),
            headers: Vec::new(),
            body: Vec::new(),
        }
    }
}

/// Parses a curl-style `Name: value` header.
pub fn parse_header(raw: &str) -> Result<(String, String), LoadError> {
    let bad = |reason: &str| LoadError::InvalidHeader {
        header: raw.to_owned(),
        reason: reason.to_owned(),
    };
    let (name, value) = raw
        .split_once(':')
        .ok_or_else(|| bad("expected `Name: value`"))?;
    let name = name.trim();
    if name.is_empty() || !name.bytes().all(is_token) {
        return Err(bad("the name must be letters, digits or !#$%&'*+-.^_`|~"));
    }
    let value = value.trim();
    if value.bytes().any(|b| (b < b' ' && b != b'\t') || b == 0x7f) {
        return Err(bad("the value contains a line break or control character"));
    }
    Ok((name.to_owned(), value.to_owned()))
}

/// Whether `b` may appear in an HTTP token (a method or a header name).
pub(crate) fn is_token(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

impl RequestSpec {
    /// Whether the method is HEAD (its responses have no body).
    pub fn is_head(&self) -> bool {
        self.method.eq_ignore_ascii_case("HEAD")
    }

    /// The Host header value that will be sent.
    pub fn host_header(&self, target: &Target) -> String {
        self.header("host")
            .map_or_else(|| target.authority(), str::to_owned)
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Renders the whole request. `close` adds `Connection: close`.
    pub fn render(&self, target: &Target, close: bool) -> Result<Vec<u8>, LoadError> {
        if self.method.is_empty() || !self.method.bytes().all(is_token) {
            return Err(LoadError::InvalidPlan {
                field: "-X/--method".to_owned(),
                reason: format!("`{}` is not an HTTP method", self.method),
            });
        }
        for (name, value) in &self.headers {
            parse_header(&format!("{name}: {value}"))?;
        }
        let mut out = Vec::with_capacity(256 + self.body.len());
        out.extend_from_slice(format!("{} {} HTTP/1.1\r\n", self.method, target.path).as_bytes());
        out.extend_from_slice(format!("Host: {}\r\n", self.host_header(target)).as_bytes());
        if self.header("user-agent").is_none() {
            out.extend_from_slice(
                concat!(
                    "User-Agent: ingressbench/",
                    env!("CARGO_PKG_VERSION"),
                    "\r\n"
                )
                .as_bytes(),
            );
        }
        if self.header("accept").is_none() {
            out.extend_from_slice(b"Accept: */*\r\n");
        }
        for (name, value) in self
            .headers
            .iter()
            .filter(|(n, _)| !n.eq_ignore_ascii_case("host"))
        {
            out.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
        }
        let wants_length = !self.body.is_empty()
            || ["POST", "PUT", "PATCH"].contains(&self.method.to_ascii_uppercase().as_str());
        if wants_length && self.header("content-length").is_none() {
            out.extend_from_slice(format!("Content-Length: {}\r\n", self.body.len()).as_bytes());
        }
        if close && self.header("connection").is_none() {
            out.extend_from_slice(b"Connection: close\r\n");
        }
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(&self.body);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_host_override_headers_and_body() {
        let target = Target::parse("http://127.0.0.1:8080/echo").unwrap();
        let spec = RequestSpec {
            method: "POST".into(),
            headers: vec![
                parse_header("Host: app.test").unwrap(),
                parse_header("X-A:  b ").unwrap(),
            ],
            body: b"hi".to_vec(),
        };
        let raw = String::from_utf8(spec.render(&target, true).unwrap()).unwrap();
        assert!(
            raw.starts_with("POST /echo HTTP/1.1\r\nHost: app.test\r\n"),
            "{raw}"
        );
        assert!(raw.contains("\r\nX-A: b\r\n"));
        assert!(raw.contains("\r\nContent-Length: 2\r\n"));
        assert!(raw.contains("\r\nConnection: close\r\n"));
        assert!(raw.ends_with("\r\n\r\nhi"));
        assert_eq!(raw.matches("Host:").count(), 1);
    }

    #[test]
    fn hostile_headers_are_rejected() {
        assert!(parse_header("X-A: b\r\nX-Injected: 1").is_err());
        assert!(parse_header("Bad Name: x").is_err());
        assert!(parse_header("no-colon").is_err());
        let target = Target::parse("http://a/").unwrap();
        let spec = RequestSpec {
            method: "GET /x".into(),
            ..RequestSpec::default()
        };
        assert!(spec.render(&target, false).is_err());
    }
}
