//! Where requests go: the URL, and curl-style `--resolve` overrides.

use std::fmt;
use std::net::{IpAddr, SocketAddr};

use crate::LoadError;

/// The scheme of a target URL.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    /// Plain HTTP/1.1.
    Http,
    /// HTTP/1.1 over TLS.
    Https,
}

/// A parsed `http://` or `https://` URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// The scheme.
    pub scheme: Scheme,
    /// The host as written, without brackets for IPv6.
    pub host: String,
    /// The port, explicit or the scheme's default.
    pub port: u16,
    /// Path and query, starting with `/`.
    pub path: String,
    /// Whether the URL named the port explicitly.
    explicit_port: bool,
}

impl Target {
    /// Parses a URL such as `https://example.test:8443/echo?x=1`.
    pub fn parse(url: &str) -> Result<Self, LoadError> {
        let bad = |reason: &str| LoadError::InvalidUrl {
            url: url.to_owned(),
            reason: reason.to_owned(),
        };
        let (scheme, rest) = if let Some(rest) = url.strip_prefix("http://") {
            (Scheme::Http, rest)
        } else if let Some(rest) = url.strip_prefix("https://") {
            (Scheme::Https, rest)
        } else {
            return Err(bad("it must start with http:// or https://"));
        };
        let (authority, path) = match rest.find(['/', '?']) {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        let path = if path.starts_with('?') {
            format!("/{path}")
        } else {
            path.to_owned()
        };
        if let Some(i) = path.find('#') {
            return Err(bad(&format!(
                "fragments are not sent to servers; remove `{}`",
                &path[i..]
            )));
        }
        if path.bytes().any(|b| b <= b' ' || b == 0x7f) {
            return Err(bad(
                "the path contains spaces or control characters; percent-encode them",
            ));
        }
        if authority.contains('@') {
            return Err(bad(
                "user:password@ is not supported; send an Authorization header with -H",
            ));
        }
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let end = v6
                .find(']')
                .ok_or_else(|| bad("unclosed [ in an IPv6 address"))?;
            let host = &v6[..end];
            host.parse::<std::net::Ipv6Addr>()
                .map_err(|_| bad("not an IPv6 address inside [ ]"))?;
            match &v6[end + 1..] {
                "" => (host, None),
                p => (
                    host,
                    Some(p.strip_prefix(':').ok_or_else(|| bad("junk after ]"))?),
                ),
            }
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (authority, None),
            }
        };
        if host.is_empty() {
            return Err(bad("no host"));
        }
        if !host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._:".contains(&b))
        {
            return Err(bad("the host has characters a host name cannot have"));
        }
        let default_port = match scheme {
            Scheme::Http => 80,
            Scheme::Https => 443,
        };
        let port = match port {
            Some(p) => p
                .parse::<u16>()
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| bad("the port must be 1-65535"))?,
            None => default_port,
        };
        Ok(Self {
            scheme,
            host: host.to_owned(),
            port,
            path,
            explicit_port: port != default_port,
        })
    }

    /// The value of the Host header for this URL (`host[:port]`).
    pub fn authority(&self) -> String {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        if self.explicit_port {
            format!("{host}:{}", self.port)
        } else {
            host
        }
    }

    /// The host as an IP address, if it is one.
    pub fn ip(&self) -> Option<IpAddr> {
        self.host.parse().ok()
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = match self.scheme {
            Scheme::Http => "http",
            Scheme::Https => "https",
        };
        write!(f, "{scheme}://{}{}", self.authority(), self.path)
    }
}

/// A `--resolve host:port:addr` entry: connections to `host:port` go to `addr`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Resolve {
    /// Host name as in the URL.
    pub host: String,
    /// Port as in the URL.
    pub port: u16,
    /// Address to connect to instead.
    pub addr: IpAddr,
}

impl Resolve {
    /// Parses curl's `host:port:addr` form (`addr` may be `[v6]`).
    pub fn parse(s: &str) -> Result<Self, LoadError> {
        let bad = || LoadError::InvalidPlan {
            field: "--resolve".to_owned(),
            reason: format!(
                "`{s}` is not host:port:address (for example example.test:443:127.0.0.1)"
            ),
        };
        let mut parts = s.splitn(3, ':');
        let host = parts.next().filter(|h| !h.is_empty()).ok_or_else(bad)?;
        let port = parts
            .next()
            .and_then(|p| p.parse::<u16>().ok())
            .ok_or_else(bad)?;
        let addr = parts.next().ok_or_else(bad)?;
        let addr = addr.trim_start_matches('[').trim_end_matches(']');
        let addr = addr.parse::<IpAddr>().map_err(|_| bad())?;
        Ok(Self {
            host: host.to_owned(),
            port,
            addr,
        })
    }

    /// The address to use for `target`, if this entry covers it.
    pub fn applies_to(&self, target: &Target) -> Option<SocketAddr> {
        (self.host.eq_ignore_ascii_case(&target.host) && self.port == target.port)
            .then(|| SocketAddr::new(self.addr, self.port))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_usual_shapes() {
        let t = Target::parse("https://example.test:8443/a/b?c=d").unwrap();
        assert_eq!(
            (t.scheme, t.host.as_str(), t.port, t.path.as_str()),
            (Scheme::Https, "example.test", 8443, "/a/b?c=d")
        );
        assert_eq!(t.authority(), "example.test:8443");
        let t = Target::parse("http://127.0.0.1").unwrap();
        assert_eq!(
            (t.port, t.path.as_str(), t.authority().as_str()),
            (80, "/", "127.0.0.1")
        );
        let t = Target::parse("http://[::1]:9000?x").unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.path.as_str()),
            ("::1", 9000, "/?x")
        );
        assert_eq!(t.authority(), "[::1]:9000");
        assert_eq!(t.to_string(), "http://[::1]:9000/?x");
    }

    #[test]
    fn rejects_with_a_reason() {
        for (url, why) in [
            ("ftp://x", "http:// or https://"),
            ("127.0.0.1:80", "http:// or https://"),
            ("http://:80/", "no host"),
            ("http://a:99999/", "1-65535"),
            ("http://u:p@a/", "Authorization"),
            ("http://a/b c", "percent-encode"),
            ("http://a/#frag", "fragments"),
            ("http://a;b/", "host name"),
        ] {
            let err = Target::parse(url).unwrap_err().to_string();
            assert!(err.contains(why), "{url}: {err}");
        }
    }

    #[test]
    fn resolve_matches_host_and_port() {
        let r = Resolve::parse("example.test:443:127.0.0.1").unwrap();
        let t = Target::parse("https://EXAMPLE.test/").unwrap();
        assert_eq!(r.applies_to(&t), Some("127.0.0.1:443".parse().unwrap()));
        let t = Target::parse("https://example.test:8443/").unwrap();
        assert_eq!(r.applies_to(&t), None);
        assert!(Resolve::parse("example.test:443").is_err());
        assert_eq!(
            Resolve::parse("a:1:[::1]").unwrap().addr,
            "::1".parse::<IpAddr>().unwrap()
        );
    }
}
