//! One mail of a series: mbox splitting, header parsing (unfolding, RFC 2047
//! encoded words), body decoding and the in-body headers that `git am` honours.
//!
//! Everything here works on bytes and never panics: a mail is untrusted input.
//!
//! One file over 500 lines: RFC 5322/2047 parsing and its tests together,
//! because each rule's test is the proof it refuses what it must.

/// One message cut out of a file, with the 1-based line where it starts.
#[derive(Debug, Clone)]
pub(crate) struct RawMessage {
    /// The message bytes, mboxrd `>From ` quoting removed, separator line kept.
    pub bytes: Vec<u8>,
    /// Line of the file on which the message starts.
    pub first_line: usize,
}

/// A header field after unfolding and RFC 2047 decoding.
#[derive(Debug, Clone)]
pub(crate) struct Header {
    pub name: String,
    pub value: String,
    /// Line of the file on which the field starts.
    pub line: usize,
}

/// A parsed mail: headers, the decoded plain-text body and where it starts.
#[derive(Debug, Clone)]
pub(crate) struct Mail {
    pub headers: Vec<Header>,
    /// Header fields found at the top of the body (`From:`, `Date:`,
    /// `Subject:`), which override the mail's own as `git am` does.
    pub in_body: Vec<Header>,
    /// The decoded body, in-body headers removed.
    pub body: Vec<u8>,
    /// Line of the file on which `body` starts. When the body was transfer
    /// encoded (quoted-printable, base64) lines inside it are counted from
    /// there in decoded form.
    pub body_line: usize,
    /// The message as git would see it: header bytes plus decoded body.
    pub canonical: Vec<u8>,
    /// Set when the only text in the message is `text/html`.
    pub html_only: bool,
}

impl Mail {
    /// The value of a header, the in-body one first.
    pub fn get(&self, name: &str) -> Option<&Header> {
        self.in_body
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .or_else(|| self.mail_header(name))
    }

    /// The value of a header of the mail itself, ignoring in-body headers.
    pub fn mail_header(&self, name: &str) -> Option<&Header> {
        self.headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
    }
}

/// Split into lines, each keeping its `\n`.
pub(crate) fn lines(bytes: &[u8]) -> impl Iterator<Item = &[u8]> {
    bytes.split_inclusive(|&b| b == b'\n')
}

/// Strip one trailing `\n` and `\r`.
pub(crate) fn chomp(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// Is this an mbox separator line (`From <sha> Mon Sep 17 00:00:00 2001`)?
/// The same test as git mailsplit: `From `, then a time `hh:mm` late in the
/// line and a year after it.
pub(crate) fn is_from_line(line: &[u8]) -> bool {
    let line = chomp(line);
    if line.len() < 20 || !line.starts_with(b"From ") {
        return false;
    }
    let rest = &line[5..];
    let Some(colon) = rest.iter().rposition(|&b| b == b':') else {
        return false;
    };
    let digit = |i: isize| -> bool {
        let i = colon as isize + i;
        i >= 0 && (i as usize) < rest.len() && rest[i as usize].is_ascii_digit()
    };
    if !(digit(-4) && digit(-2) && digit(-1) && digit(1) && digit(2)) {
        return false;
    }
    let year: String = rest[colon + 3..]
        .iter()
        .skip_while(|b| b.is_ascii_whitespace())
        .take_while(|b| b.is_ascii_digit())
        .map(|&b| b as char)
        .collect();
    year.parse::<u32>().map(|y| y > 90).unwrap_or(false)
}

/// Cut an mbox into messages. A file that does not start with a separator is
/// one message (a bare `git format-patch` file without its `From ` line).
pub(crate) fn split_mbox(bytes: &[u8]) -> Vec<RawMessage> {
    let mut out: Vec<RawMessage> = Vec::new();
    let mut current: Option<RawMessage> = None;
    for (i, line) in lines(bytes).enumerate() {
        let lineno = i + 1;
        if is_from_line(line) {
            if let Some(m) = current.take() {
                out.push(m);
            }
            current = Some(RawMessage {
                bytes: line.to_vec(),
                first_line: lineno,
            });
            continue;
        }
        let msg = current.get_or_insert_with(|| RawMessage {
            bytes: Vec::new(),
            first_line: lineno,
        });
        // mboxrd: ">From " (any number of '>') loses one '>'.
        let quoted = line.iter().take_while(|&&b| b == b'>').count();
        if quoted > 0 && line[quoted..].starts_with(b"From ") {
            msg.bytes.extend_from_slice(&line[1..]);
        } else {
            msg.bytes.extend_from_slice(line);
        }
    }
    if let Some(m) = current {
        out.push(m);
    }
    out
}

fn is_header_start(line: &[u8]) -> bool {
    let Some(colon) = line.iter().position(|&b| b == b':') else {
        return false;
    };
    colon > 0 && line[..colon].iter().all(|&b| (33..=126).contains(&b))
}

/// Parse one message. Returns `None` when it does not start with a header
/// block (it is not a mail at all).
pub(crate) fn parse(msg: &RawMessage) -> Option<Mail> {
    let bytes = &msg.bytes;
    let mut pos = 0usize;
    let mut line_no = msg.first_line;
    // Skip the mbox separator.
    if let Some(first) = lines(bytes).next() {
        if is_from_line(first) {
            pos += first.len();
            line_no += 1;
        }
    }
    let header_start = pos;
    // (line number, unfolded raw bytes)
    let mut raw_headers: Vec<(usize, Vec<u8>)> = Vec::new();
    let mut body_start = bytes.len();
    let mut body_line = line_no;
    for line in lines(&bytes[pos..]) {
        let content = chomp(line);
        if content.is_empty() {
            body_start = pos + line.len();
            body_line = line_no + 1;
            break;
        }
        if (content[0] == b' ' || content[0] == b'\t') && !raw_headers.is_empty() {
            if let Some(last) = raw_headers.last_mut() {
                last.1.extend_from_slice(content);
            }
        } else if is_header_start(content) {
            raw_headers.push((line_no, content.to_vec()));
        } else {
            return None;
        }
        pos += line.len();
        line_no += 1;
        body_line = line_no;
    }
    if raw_headers.is_empty() {
        return None;
    }
    let headers: Vec<Header> = raw_headers
        .iter()
        .filter_map(|(line, raw)| {
            let colon = raw.iter().position(|&b| b == b':')?;
            Some(Header {
                name: String::from_utf8_lossy(&raw[..colon]).trim().to_string(),
                value: decode_rfc2047(&String::from_utf8_lossy(&raw[colon + 1..]))
                    .trim()
                    .to_string(),
                line: *line,
            })
        })
        .collect();
    let header_bytes = &bytes[header_start..body_start.min(bytes.len())];
    let raw_body = &bytes[body_start.min(bytes.len())..];

    let content_type = find(&headers, "Content-Type").unwrap_or_default();
    let encoding = find(&headers, "Content-Transfer-Encoding").unwrap_or_default();
    let (body, html_only) = select_text(&content_type, &encoding, raw_body);

    let (in_body, body, skipped_lines) = split_in_body_headers(body, body_line);
    let mut canonical = header_bytes.to_vec();
    canonical.extend_from_slice(&body);
    Some(Mail {
        headers,
        in_body,
        body,
        body_line: body_line + skipped_lines,
        canonical,
        html_only,
    })
}

fn find(headers: &[Header], name: &str) -> Option<String> {
    headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case(name))
        .map(|h| h.value.clone())
}

/// A `Content-Type` parameter such as `boundary`.
fn param(content_type: &str, name: &str) -> Option<String> {
    content_type.split(';').skip(1).find_map(|p| {
        let (k, v) = p.split_once('=')?;
        if k.trim().eq_ignore_ascii_case(name) {
            Some(v.trim().trim_matches('"').to_string())
        } else {
            None
        }
    })
}

fn mime_type(content_type: &str) -> String {
    content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

/// Pick the plain-text body: the body itself, or the first `text/plain`
/// part of a multipart message. Returns the decoded text and whether the
/// message only had HTML to offer.
fn select_text(content_type: &str, encoding: &str, body: &[u8]) -> (Vec<u8>, bool) {
    let kind = mime_type(content_type);
    if kind == "text/html" {
        return (decode_transfer(encoding, body), true);
    }
    if !kind.starts_with("multipart/") {
        return (decode_transfer(encoding, body), false);
    }
    let Some(boundary) = param(content_type, "boundary") else {
        return (body.to_vec(), false);
    };
    let delimiter = format!("--{boundary}").into_bytes();
    let mut parts: Vec<Vec<u8>> = Vec::new();
    let mut current: Option<Vec<u8>> = None;
    for line in lines(body) {
        let content = chomp(line);
        if content.starts_with(&delimiter) {
            if let Some(p) = current.take() {
                parts.push(p);
            }
            if content[delimiter.len()..].starts_with(b"--") {
                break;
            }
            current = Some(Vec::new());
        } else if let Some(p) = current.as_mut() {
            p.extend_from_slice(line);
        }
    }
    if let Some(p) = current {
        parts.push(p);
    }
    let mut saw_html = false;
    for part in &parts {
        let Some(mail) = parse(&RawMessage {
            bytes: part.clone(),
            first_line: 1,
        }) else {
            // A part without headers is text/plain by default.
            return (part.clone(), false);
        };
        let ct = find(&mail.headers, "Content-Type").unwrap_or_default();
        let kind = mime_type(&ct);
        if kind.is_empty()
            || kind == "text/plain"
            || kind == "text/x-patch"
            || kind == "text/x-diff"
        {
            return (mail.body, false);
        }
        if kind == "text/html" || mail.html_only {
            saw_html = true;
        }
    }
    (Vec::new(), saw_html)
}

fn decode_transfer(encoding: &str, body: &[u8]) -> Vec<u8> {
    match encoding.trim().to_ascii_lowercase().as_str() {
        "quoted-printable" => decode_qp(body),
        "base64" => decode_base64(body),
        _ => body.to_vec(),
    }
}

fn hex_val(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Quoted-printable body decoding (RFC 2045 section 6.7).
pub(crate) fn decode_qp(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len());
    let mut i = 0;
    while i < body.len() {
        let b = body[i];
        if b != b'=' {
            out.push(b);
            i += 1;
            continue;
        }
        let next = body.get(i + 1).copied();
        let after = body.get(i + 2).copied();
        match (next, after) {
            (Some(b'\n'), _) => i += 2,
            (Some(b'\r'), Some(b'\n')) => i += 3,
            (Some(h), Some(l)) if hex_val(h).is_some() && hex_val(l).is_some() => {
                out.push(hex_val(h).unwrap_or(0) * 16 + hex_val(l).unwrap_or(0));
                i += 3;
            }
            _ => {
                out.push(b);
                i += 1;
            }
        }
    }
    out
}

/// Base64 decoding that skips anything outside the alphabet.
pub(crate) fn decode_base64(body: &[u8]) -> Vec<u8> {
    let val = |b: u8| -> Option<u32> {
        match b {
            b'A'..=b'Z' => Some((b - b'A') as u32),
            b'a'..=b'z' => Some((b - b'a') as u32 + 26),
            b'0'..=b'9' => Some((b - b'0') as u32 + 52),
            b'+' => Some(62),
            b'/' => Some(63),
            _ => None,
        }
    };
    let mut out = Vec::with_capacity(body.len() * 3 / 4);
    let mut acc = 0u32;
    let mut bits = 0u32;
    for &b in body {
        if b == b'=' {
            break;
        }
        let Some(v) = val(b) else { continue };
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    out
}

/// Decode RFC 2047 encoded words (`=?UTF-8?q?Jos=C3=A9?=`); whitespace
/// between two adjacent encoded words is dropped.
pub(crate) fn decode_rfc2047(value: &str) -> String {
    let mut out = String::new();
    let mut rest = value;
    let mut pending_ws = String::new();
    let mut last_was_word = false;
    while !rest.is_empty() {
        if rest.starts_with("=?") {
            if let Some((decoded, used)) = encoded_word(rest) {
                if !last_was_word {
                    out.push_str(&pending_ws);
                }
                pending_ws.clear();
                out.push_str(&decoded);
                rest = &rest[used..];
                last_was_word = true;
                continue;
            }
        }
        let Some(c) = rest.chars().next() else { break };
        if c == ' ' || c == '\t' {
            pending_ws.push(c);
        } else {
            out.push_str(&pending_ws);
            pending_ws.clear();
            out.push(c);
            last_was_word = false;
        }
        rest = &rest[c.len_utf8()..];
    }
    out.push_str(&pending_ws);
    out
}

/// One encoded word at the start of `s`: decoded text and bytes consumed.
fn encoded_word(s: &str) -> Option<(String, usize)> {
    let inner = s.get(2..)?;
    let q1 = inner.find('?')?;
    let charset = &inner[..q1];
    let after_charset = &inner[q1 + 1..];
    let q2 = after_charset.find('?')?;
    let enc = &after_charset[..q2];
    let text_and_rest = &after_charset[q2 + 1..];
    let end = text_and_rest.find("?=")?;
    let text = &text_and_rest[..end];
    if text.contains(' ') || charset.is_empty() {
        return None;
    }
    let bytes = match enc {
        "Q" | "q" => {
            let underscored: Vec<u8> = text
                .bytes()
                .map(|b| if b == b'_' { b' ' } else { b })
                .collect();
            decode_qp(&underscored)
        }
        "B" | "b" => decode_base64(text.as_bytes()),
        _ => return None,
    };
    // Charset may carry an RFC 2231 language: "UTF-8*en".
    let charset = charset.split('*').next().unwrap_or("").to_ascii_lowercase();
    let decoded = if charset == "iso-8859-1" || charset == "latin1" || charset == "us-ascii" {
        bytes.iter().map(|&b| b as char).collect()
    } else {
        String::from_utf8_lossy(&bytes).into_owned()
    };
    let used = 2 + q1 + 1 + q2 + 1 + end + 2;
    Some((decoded, used))
}

/// Take `From:`, `Date:` and `Subject:` lines from the top of the body, as
/// `git am` does (a blank line ends them). Returns the headers, the rest of
/// the body and how many lines were removed.
fn split_in_body_headers(body: Vec<u8>, body_line: usize) -> (Vec<Header>, Vec<u8>, usize) {
    let mut found = Vec::new();
    let mut consumed = 0usize;
    let mut skipped = 0usize;
    let mut leading_blank = 0usize;
    let mut leading_bytes = 0usize;
    for line in lines(&body) {
        let content = chomp(line);
        if found.is_empty() && content.iter().all(|b| b.is_ascii_whitespace()) {
            leading_blank += 1;
            leading_bytes += line.len();
            continue;
        }
        let text = String::from_utf8_lossy(content);
        let name = ["From", "Date", "Subject"].into_iter().find(|n| {
            text.len() > n.len()
                && text.is_char_boundary(n.len())
                && text[..n.len()].eq_ignore_ascii_case(n)
                && text[n.len()..].starts_with(':')
        });
        match name {
            Some(n) => {
                found.push(Header {
                    name: n.to_string(),
                    value: decode_rfc2047(&text[n.len() + 1..]).trim().to_string(),
                    line: body_line + leading_blank + found.len(),
                });
                skipped += 1;
                consumed = leading_bytes + line.len();
                leading_bytes = consumed;
            }
            None => {
                if !found.is_empty() && content.is_empty() {
                    // The blank line that ends the in-body headers.
                    consumed += line.len();
                    skipped += 1;
                }
                break;
            }
        }
    }
    if found.is_empty() {
        return (found, body, 0);
    }
    let rest = body.get(consumed..).unwrap_or_default().to_vec();
    (found, rest, leading_blank + skipped)
}

/// Split `Name <email>` (or `email (Name)`, or a bare address) into parts.
pub(crate) fn split_address(value: &str) -> (String, String) {
    let value = value.trim();
    if let (Some(open), Some(close)) = (value.rfind('<'), value.rfind('>')) {
        if open < close {
            let name = value[..open].trim().trim_matches('"').trim().to_string();
            let email = value[open + 1..close].trim().to_string();
            return (name, email);
        }
    }
    if let (Some(open), Some(close)) = (value.find('('), value.rfind(')')) {
        if open < close {
            let email = value[..open].trim().to_string();
            let name = value[open + 1..close].trim().to_string();
            return (name, email);
        }
    }
    (String::new(), value.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc2047_words_are_decoded_and_joined() {
        assert_eq!(
            decode_rfc2047("=?UTF-8?q?Jos=C3=A9_M?= <j@x>"),
            "José M <j@x>"
        );
        assert_eq!(
            decode_rfc2047("=?utf-8?B?W1BBVENIXQ==?= =?utf-8?Q?_rust?="),
            "[PATCH] rust"
        );
        assert_eq!(decode_rfc2047("plain =?bogus"), "plain =?bogus");
    }

    #[test]
    fn from_lines_follow_mailsplit() {
        assert!(is_from_line(
            b"From 0123456789abcdef0123456789abcdef01234567 Mon Sep 17 00:00:00 2001\n"
        ));
        assert!(!is_from_line(b"From: FUJITA Tomonori <f@x>\n"));
        assert!(!is_from_line(b"From the beginning, this was wrong\n"));
    }

    #[test]
    fn mboxrd_quoting_is_removed() {
        let mbox = b"From x Mon Sep 17 00:00:00 2001\nSubject: a\n\n>From here\n>>From there\n";
        let msgs = split_mbox(mbox);
        assert_eq!(msgs.len(), 1);
        assert!(msgs[0].bytes.ends_with(b"\nFrom here\n>From there\n"));
    }

    #[test]
    fn folded_subject_is_unfolded() {
        let raw = RawMessage {
            bytes: b"Subject: [PATCH v2 1/2] a long\n subject\nFrom: A <a@x>\n\nbody\n".to_vec(),
            first_line: 1,
        };
        let mail = parse(&raw).expect("mail");
        assert_eq!(
            mail.get("subject").map(|h| h.value.as_str()),
            Some("[PATCH v2 1/2] a long subject")
        );
        assert_eq!(mail.body_line, 5);
    }

    #[test]
    fn addresses_split() {
        assert_eq!(
            split_address("\"Ojeda, Miguel\" <ojeda@kernel.org>"),
            ("Ojeda, Miguel".to_string(), "ojeda@kernel.org".to_string())
        );
        assert_eq!(
            split_address("a@b (A B)"),
            ("A B".to_string(), "a@b".to_string())
        );
    }
}
