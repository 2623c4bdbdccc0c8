//! Socket address syntax shared by the usbredir, wire and control options.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum AddrError {
    #[error("'{0}': expected unix:PATH, a path with '/', or HOST:PORT")]
    Socket(String),
    #[error(
        "'{0}': expected none, stream:ADDR, stream-listen:ADDR, dgram:LOCAL,REMOTE or tap:IFNAME"
    )]
    Wire(String),
    #[error("'{0}': a tap interface name is 1 to 15 characters of [A-Za-z0-9_.-]")]
    TapName(String),
    #[error("'{0}': local and remote must both be unix paths or both HOST:PORT")]
    MixedFamilies(String),
}

/// A unix socket path or an inet HOST:PORT.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SockAddr {
    Unix(PathBuf),
    Inet(String),
}

impl FromStr for SockAddr {
    type Err = AddrError;

    fn from_str(s: &str) -> Result<SockAddr, AddrError> {
        let err = || AddrError::Socket(s.to_string());
        if let Some(p) = s.strip_prefix("unix:") {
            if p.is_empty() {
                return Err(err());
            }
            return Ok(SockAddr::Unix(p.into()));
        }
        let inet = s.strip_prefix("tcp:").or_else(|| s.strip_prefix("udp:"));
        if inet.is_none() && s.contains('/') {
            return Ok(SockAddr::Unix(s.into()));
        }
        let hp = inet.unwrap_or(s);
        match hp.rsplit_once(':') {
            Some((h, p)) if !h.is_empty() && p.parse::<u16>().is_ok() => {
                Ok(SockAddr::Inet(hp.to_string()))
            }
            _ => Err(err()),
        }
    }
}

impl fmt::Display for SockAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SockAddr::Unix(p) => write!(f, "unix:{}", p.display()),
            SockAddr::Inet(a) => write!(f, "{a}"),
        }
    }
}

/// Where Ethernet frames go: QEMU `-netdev stream` (4-byte big-endian
/// length prefix) or `-netdev dgram` (one frame per datagram).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WireSpec {
    None,
    /// Connect to a `-netdev stream,server=on` socket.
    StreamConnect(SockAddr),
    /// Wait for a `-netdev stream,server=off` to connect.
    StreamListen(SockAddr),
    /// Bind `local`, send to `remote`.
    Dgram {
        local: SockAddr,
        remote: SockAddr,
    },
    /// An existing tap interface of this network namespace (the link
    /// partner is then the host kernel's stack in that namespace).
    Tap(String),
}

impl FromStr for WireSpec {
    type Err = AddrError;

    fn from_str(s: &str) -> Result<WireSpec, AddrError> {
        if s == "none" {
            return Ok(WireSpec::None);
        }
        if let Some(a) = s.strip_prefix("stream-listen:") {
            return Ok(WireSpec::StreamListen(a.parse()?));
        }
        if let Some(a) = s.strip_prefix("stream:") {
            return Ok(WireSpec::StreamConnect(a.parse()?));
        }
        if let Some(name) = s.strip_prefix("tap:") {
            let ok = !name.is_empty()
                && name.len() < 16
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
            if !ok || name == "." || name == ".." {
                return Err(AddrError::TapName(s.to_string()));
            }
            return Ok(WireSpec::Tap(name.to_string()));
        }
        if let Some(a) = s.strip_prefix("dgram:") {
            let (l, r) = a
                .split_once(',')
                .ok_or_else(|| AddrError::Wire(s.to_string()))?;
            let (local, remote): (SockAddr, SockAddr) = (l.parse()?, r.parse()?);
            if matches!(local, SockAddr::Unix(_)) != matches!(remote, SockAddr::Unix(_)) {
                return Err(AddrError::MixedFamilies(s.to_string()));
            }
            return Ok(WireSpec::Dgram { local, remote });
        }
        Err(AddrError::Wire(s.to_string()))
    }
}

impl fmt::Display for WireSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireSpec::None => write!(f, "none"),
            WireSpec::StreamConnect(a) => write!(f, "stream:{a}"),
            WireSpec::StreamListen(a) => write!(f, "stream-listen:{a}"),
            WireSpec::Dgram { local, remote } => write!(f, "dgram:{local},{remote}"),
            WireSpec::Tap(name) => write!(f, "tap:{name}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_addresses() {
        assert_eq!("unix:x.sock".parse(), Ok(SockAddr::Unix("x.sock".into())));
        assert_eq!("./x.sock".parse(), Ok(SockAddr::Unix("./x.sock".into())));
        assert_eq!(
            "127.0.0.1:4000".parse(),
            Ok(SockAddr::Inet("127.0.0.1:4000".into()))
        );
        assert_eq!(
            "tcp:localhost:1".parse(),
            Ok(SockAddr::Inet("localhost:1".into()))
        );
        assert!("localhost".parse::<SockAddr>().is_err());
        assert!("host:99999".parse::<SockAddr>().is_err());
        assert!("unix:".parse::<SockAddr>().is_err());
    }

    #[test]
    fn wire_specs() {
        assert_eq!("none".parse(), Ok(WireSpec::None));
        let w: WireSpec = "dgram:udp:127.0.0.1:5001,127.0.0.1:5000".parse().unwrap();
        assert_eq!(w.to_string(), "dgram:127.0.0.1:5001,127.0.0.1:5000");
        assert!(matches!(
            "stream-listen:unix:a".parse(),
            Ok(WireSpec::StreamListen(_))
        ));
        assert!(matches!(
            "dgram:unix:a,127.0.0.1:1".parse::<WireSpec>(),
            Err(AddrError::MixedFamilies(_))
        ));
        assert!("socket:x".parse::<WireSpec>().is_err());
        assert_eq!("tap:pf0".parse(), Ok(WireSpec::Tap("pf0".into())));
        assert_eq!(WireSpec::Tap("pf0".into()).to_string(), "tap:pf0");
        for bad in [
            "tap:",
            "tap:sixteen-chars-xy",
            "tap:a/b",
            "tap:..",
            "tap:a b",
        ] {
            assert!(
                matches!(bad.parse::<WireSpec>(), Err(AddrError::TapName(_))),
                "{bad}"
            );
        }
    }
}
