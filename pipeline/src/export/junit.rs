//! JUnit XML: one `<testsuite>` per run, one `<testcase>` per build, check
//! attempt and measurement; FAIL is `<failure>`, ERROR and MISS are
//! `<error>` (a harness problem is never a failure), SKIP is `<skipped>`.

use super::Bundle;
use crate::results::{Run, Status};

/// Escape for XML text and attributes; characters XML 1.0 cannot carry
/// (most control characters) are dropped.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\t' | '\n' | '\r' => out.push(c),
            c if (c as u32) < 0x20 || c == '\u{FFFE}' || c == '\u{FFFF}' => {}
            c => out.push(c),
        }
    }
    out
}

struct Case {
    classname: String,
    name: String,
    status: Status,
    time: f64,
    text: String,
}

fn split(path: &str) -> (String, String) {
    match path.rsplit_once('.') {
        Some((c, n)) => (c.to_string(), n.to_string()),
        None => (String::new(), path.to_string()),
    }
}

fn cases(run: &Run) -> Vec<Case> {
    let mut out = Vec::new();
    for b in &run.builds {
        let (classname, name) = split(&b.path());
        let mut text = b.log_excerpt.clone();
        if !b.new_warnings.is_empty() {
            text.push_str(&format!("\nnew warnings:\n{}", b.new_warnings.join("\n")));
        }
        out.push(Case {
            classname,
            name,
            status: b.status,
            time: b.duration_s,
            text,
        });
    }
    for t in &run.tests {
        let (mut classname, mut name) = split(&t.path);
        if let Some(v) = &t.variant {
            classname = format!("{classname}[{v}]");
        }
        if t.attempt > 0 {
            name.push_str(" (retry)");
        }
        out.push(Case {
            classname,
            name,
            status: t.status,
            time: t.duration_s.unwrap_or(0.0),
            text: t.log_excerpt.clone(),
        });
    }
    for m in &run.measurements {
        let (mut classname, name) = split(&m.name);
        if let Some(v) = &m.variant {
            classname = format!("{classname}[{v}]");
        }
        out.push(Case {
            classname,
            name: format!("{name} (measurement)"),
            status: Status::Done,
            time: 0.0,
            text: format!("{} {} samples {:?}", m.value, m.unit, m.samples),
        });
    }
    out
}

fn suite(label: &str, run: &Run, xml: &mut String) -> [usize; 4] {
    let cs = cases(run);
    let n = |f: &dyn Fn(Status) -> bool| cs.iter().filter(|c| f(c.status)).count();
    let counts = [
        cs.len(),
        n(&|s| s == Status::Fail),
        n(&|s| s.incomplete()),
        n(&|s| s == Status::Skip),
    ];
    let time: f64 = cs.iter().map(|c| c.time).sum();
    xml.push_str(&format!(
        "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{}\" errors=\"{}\" skipped=\"{}\" time=\"{time:.3}\" timestamp=\"{}\" hostname=\"{}\">\n",
        escape(&format!("{label} run {}", run.id)),
        counts[0], counts[1], counts[2], counts[3],
        run.started,
        escape(&run.environment.host),
    ));
    xml.push_str("    <properties>\n");
    for (k, v) in [
        ("base", run.base.as_str()),
        ("accelerator", run.environment.accelerator.as_str()),
        ("reproducer", run.reproducer.as_str()),
    ] {
        xml.push_str(&format!(
            "      <property name=\"{k}\" value=\"{}\"/>\n",
            escape(v)
        ));
    }
    xml.push_str("    </properties>\n");
    for c in cs {
        xml.push_str(&format!(
            "    <testcase classname=\"{}\" name=\"{}\" time=\"{:.3}\">\n",
            escape(&c.classname),
            escape(&c.name),
            c.time
        ));
        let last = c.text.lines().last().unwrap_or("").to_string();
        match c.status {
            Status::Fail => xml.push_str(&format!(
                "      <failure type=\"FAIL\" message=\"{}\">{}</failure>\n",
                escape(&last),
                escape(&c.text)
            )),
            s if s.incomplete() => xml.push_str(&format!(
                "      <error type=\"{s}\" message=\"{}\">{}</error>\n",
                escape(&last),
                escape(&c.text)
            )),
            Status::Skip => {
                xml.push_str(&format!("      <skipped message=\"{}\"/>\n", escape(&last)))
            }
            _ if !c.text.is_empty() => xml.push_str(&format!(
                "      <system-out>{}</system-out>\n",
                escape(&c.text)
            )),
            _ => {}
        }
        xml.push_str("    </testcase>\n");
    }
    xml.push_str("  </testsuite>\n");
    counts
}

pub fn export(b: &Bundle) -> String {
    let mut body = String::new();
    let mut total = [0usize; 4];
    let label = b.report.revision.to_string();
    let mut add = |c: [usize; 4]| {
        for (t, c) in total.iter_mut().zip(c) {
            *t += c;
        }
    };
    if let Some(base) = &b.base {
        add(suite("base", base, &mut body));
    }
    for run in &b.runs {
        add(suite(&label, run, &mut body));
    }
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"{}\" tests=\"{}\" failures=\"{}\" errors=\"{}\" skipped=\"{}\">\n{body}</testsuites>\n",
        escape(&format!("phyfarm {label}")),
        total[0], total[1], total[2], total[3]
    )
}
