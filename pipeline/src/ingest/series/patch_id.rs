//! `git patch-id --stable`, computed in process.
//!
//! The same line rules as git's `builtin/patch-id.c`: the commit message is
//! skipped, whitespace is removed from every hashed line, `index` lines are
//! not hashed (their object names are, for binary diffs), and with `--stable`
//! each file's SHA-1 is summed into the result so the file order does not
//! matter.

use sha1::{Digest, Sha1};

fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// The line as C code sees it: up to the first NUL.
fn c_str(line: &[u8]) -> &[u8] {
    match line.iter().position(|&b| b == 0) {
        Some(i) => &line[..i],
        None => line,
    }
}

fn is_hex40(p: &[u8]) -> bool {
    p.len() >= 40 && p[..40].iter().all(|b| b.is_ascii_hexdigit())
}

/// `atoi` over a run of digits, clamped like glibc's `strtol` then cast.
fn atoi(p: &[u8]) -> i64 {
    let mut v: i64 = 0;
    for &b in p.iter().take_while(|b| b.is_ascii_digit()) {
        v = v.saturating_mul(10).saturating_add((b - b'0') as i64);
    }
    v as i32 as i64
}

fn span_digits(p: &[u8]) -> usize {
    p.iter().take_while(|b| b.is_ascii_digit()).count()
}

/// git's `scan_hunk_header`: sets the line counts, defaulting to 1.
fn scan_hunk_header(line: &[u8], before: &mut i64, after: &mut i64) {
    let mut q = line.get(4..).unwrap_or_default();
    let mut n = span_digits(q);
    if q.get(n) == Some(&b',') {
        q = &q[n + 1..];
        *before = atoi(q);
        n = span_digits(q);
    } else {
        *before = 1;
    }
    if n == 0 || q.get(n) != Some(&b' ') || q.get(n + 1) != Some(&b'+') {
        return;
    }
    let mut r = &q[n + 2..];
    n = span_digits(r);
    if r.get(n) == Some(&b',') {
        r = &r[n + 1..];
        *after = atoi(r);
    } else {
        *after = 1;
    }
}

fn flush(result: &mut [u8; 20], ctx: &mut Sha1) {
    let hash = std::mem::take(ctx).finalize();
    let mut carry: u16 = 0;
    for (r, h) in result.iter_mut().zip(hash.iter()) {
        carry += *r as u16 + *h as u16;
        *r = carry as u8;
        carry >>= 8;
    }
}

struct One {
    result: [u8; 20],
    patchlen: usize,
    consumed: usize,
}

/// One round of git's `get_one_patchid` over `input`, returning how many
/// bytes it read.
fn one(input: &[u8]) -> One {
    let mut result = [0u8; 20];
    let mut ctx = Sha1::new();
    let mut patchlen = 0usize;
    let mut before: i64 = -1;
    let mut after: i64 = -1;
    let mut binary = false;
    let mut pre_oid: Vec<u8> = Vec::new();
    let mut post_oid: Vec<u8> = Vec::new();
    let mut consumed = 0usize;

    for whole in input.split_inclusive(|&b| b == b'\n') {
        consumed += whole.len();
        let line = c_str(whole);
        let prefixed = line
            .strip_prefix(b"commit ")
            .or_else(|| line.strip_prefix(b"From "));
        if prefixed.is_none() && line.starts_with(b"\\ ") && line.len() > 12 {
            continue;
        }
        if is_hex40(prefixed.unwrap_or(line)) {
            break;
        }
        if patchlen == 0 && !line.starts_with(b"diff ") {
            continue;
        }
        if before == -1 {
            if line.starts_with(b"GIT binary patch") || line.starts_with(b"Binary files") {
                binary = true;
                before = 0;
                ctx.update(&pre_oid);
                ctx.update(&post_oid);
                flush(&mut result, &mut ctx);
                continue;
            } else if let Some(rest) = line.strip_prefix(b"index ") {
                let dots = line.windows(2).position(|w| w == b"..");
                if let Some(d) = dots {
                    let end = line[d..]
                        .iter()
                        .position(|&b| b == b' ')
                        .map(|i| d + i)
                        .unwrap_or(line.len().saturating_sub(1));
                    let pre_start = line.len() - rest.len();
                    pre_oid = line.get(pre_start..d).unwrap_or_default().to_vec();
                    post_oid = line.get(d + 2..end.max(d + 2)).unwrap_or_default().to_vec();
                    pre_oid.truncate(64);
                    post_oid.truncate(64);
                }
                continue;
            } else if line.starts_with(b"--- ") {
                before = 1;
                after = 1;
            } else if !line.first().is_some_and(|b| b.is_ascii_alphabetic()) {
                break;
            }
        }
        if binary {
            if line.starts_with(b"diff ") {
                binary = false;
                before = -1;
            }
            continue;
        }
        if before == 0 && after == 0 {
            if line.starts_with(b"@@ -") {
                scan_hunk_header(line, &mut before, &mut after);
                continue;
            }
            if !line.starts_with(b"diff ") {
                break;
            }
            flush(&mut result, &mut ctx);
            before = -1;
            after = -1;
        }
        match line.first() {
            Some(b'-') => before = before.wrapping_sub(1),
            Some(b'+') => after = after.wrapping_sub(1),
            Some(b' ') => {
                before = before.wrapping_sub(1);
                after = after.wrapping_sub(1);
            }
            _ => {}
        }
        let stripped: Vec<u8> = line.iter().copied().filter(|&b| !is_c_space(b)).collect();
        patchlen += stripped.len();
        ctx.update(&stripped);
    }
    flush(&mut result, &mut ctx);
    One {
        result,
        patchlen,
        consumed,
    }
}

/// The first patch ID `git patch-id --stable` prints for `input`, as hex,
/// or `None` when git would print nothing (no diff).
pub fn stable(input: &[u8]) -> Option<String> {
    let mut rest = input;
    while !rest.is_empty() {
        let r = one(rest);
        if r.patchlen > 0 {
            return Some(r.result.iter().map(|b| format!("{b:02x}")).collect());
        }
        if r.consumed == 0 {
            break;
        }
        rest = &rest[r.consumed..];
    }
    None
}
