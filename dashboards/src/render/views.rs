//! Run, farm, trends, compare, and the empty and error pages.

use maud::{html, Markup};
use phyfarm::results::Timestamp;

use super::pages::anchor;
use super::{
    finding, layout, line_chart, opt_status, opt_time, paths, pct, status, time, variant, verdict,
    Page, Site,
};
use crate::model::{ComparePage, ComparePick, FarmPage, RunPage, StatusCounts, Trends};
use crate::text::{duration, human, LineKind, LogLine};

fn log(lines: &[LogLine]) -> Markup {
    html! {
        pre.log {
            @for l in lines {
                @match l.kind {
                    LineKind::Oops => { mark.oops { (l.text) } "\n" }
                    LineKind::Warn => { span.warnline { (l.text) } "\n" }
                    LineKind::Plain => { (l.text) "\n" }
                }
            }
        }
    }
}

fn counts(c: &StatusCounts) -> Markup {
    html! { @for (s, n) in &c.0 { (status(*s)) " " (n) " " } }
}

pub fn run(site: &Site, p: &RunPage) -> Markup {
    let env = &p.environment;
    let body = html! {
        p.crumbs {
            a href=(site.page("farm")) { "Farm" } " / run "
            @if let Some(r) = &p.revision { "of " a href=(site.page(&paths::revision_ref(r))) { (r) } } @else { "of the base" }
        }
        h1 { "Run " code { (p.id) } }
        div.verdict-box {
            div { "State: " strong { (p.state) } " · " (counts(&p.counts)) }
            div { "Started " (time(p.started)) " · finished " (opt_time(p.finished))
                @if let Some(d) = p.duration_s { " · took " (duration(d)) } }
        }
        h2 { "Reproduce" }
        pre.cmd { (p.reproducer) }
        h2 { "Environment" }
        dl.facts {
            dt { "Accelerator" } dd { strong { (env.accelerator) } }
            dt { "Host" } dd { (env.host) }
            dt { "Architecture" } dd { (env.arch) }
            dt { "Kernel base" } dd { (p.base) }
        }
        div.two {
            table.env {
                thead { tr { th { "Image" } th { "Id" } } }
                tbody { @for (k, v) in &env.images { tr { td { code { (k) } } td { code { (v) } } } } }
            }
            table.env {
                thead { tr { th { "Tool" } th { "Version" } } }
                tbody { @for (k, v) in &env.tools { tr { td { (k) } td { code { (v) } } } } }
            }
        }
        h2 { "Builds" }
        table.checks {
            thead { tr { th { "Build" } th { "Result" } th.num { "Time" } th.num { "Warnings" } th { "Log" } } }
            tbody { @for b in &p.builds {
                tr id=(anchor(&b.path, None)) {
                    td { code { (b.path) } }
                    td { (status(b.status)) }
                    td.num { (duration(b.duration_s)) }
                    td.num { (b.warnings) @if !b.new_warnings.is_empty() { br; span.fd.fd-new-warning { (b.new_warnings.len()) " new" } } }
                    td {
                        @if let Some(lp) = &b.log_path { div.small { "file " code { (lp) } } }
                        @if !b.new_warnings.is_empty() { pre.log { @for w in &b.new_warnings { (crate::text::strip_ansi(w)) "\n" } } }
                        @if !b.log.is_empty() { (log(&b.log)) }
                    }
                }
            } }
        }
        h2 { "Checks and console logs" }
        table.checks {
            thead { tr { th { "Check" } th { "Result" } th.num { "Time" } th { "Log" } } }
            tbody { @for t in &p.tests {
                tr id=(if t.attempt == 0 { anchor(&t.path, t.variant.as_deref()) } else { format!("{}-retry", anchor(&t.path, t.variant.as_deref())) }) {
                    td { code { (t.path) } " " (variant(t.variant.as_deref()))
                        @if t.attempt > 0 { " " span.tag { "retry" } } }
                    td { (status(t.status)) @if t.oops { " " span.fd.fd-new-failure { "oops in log" } } }
                    td.num { @if let Some(d) = t.duration_s { (duration(d)) } @else { "–" } }
                    td {
                        @if let Some(lp) = &t.log_path { div.small { "file " code { (lp) } } }
                        @if !t.log.is_empty() { (log(&t.log)) }
                    }
                }
            } }
        }
        @if !p.measurements.is_empty() {
            h2 { "Measurements" }
            table.measurements {
                thead { tr { th { "Measurement" } th.num { "Value" } th { "Samples" } } }
                tbody { @for m in &p.measurements { tr {
                    td { code { (m.name) } " " (variant(m.variant.as_deref())) }
                    td.num { (human(m.value, &m.unit)) }
                    td.small { @for (i, s) in m.samples.iter().enumerate() { @if i > 0 { ", " } (human(*s, &m.unit)) } }
                } } }
            }
        }
    };
    layout(
        Page {
            title: format!("Run {}", p.id),
            site,
            generated: p.generated,
            nav: "farm",
        },
        body,
    )
}

pub fn farm(site: &Site, p: &FarmPage) -> Markup {
    let body = html! {
        h1 { "Farm" }
        p {
            (p.total_runs) " runs stored"
            @for (a, n) in &p.accelerators { " · " strong { (a) } " " (n) }
            @if p.total_runs > p.runs.len() { " · the newest " (p.runs.len()) " below" }
        }
        h2 { "Flaky checks" }
        @if p.flaky.is_empty() { p.muted { "No check flipped between attempts or runs." } } @else {
            table.flaky {
                thead { tr { th { "Revision" } th { "Check" } th { "What happened" } } }
                tbody { @for f in &p.flaky { tr {
                    td { a href=(site.page(&paths::revision_ref(&f.revision))) { (f.revision) } }
                    td { code { (f.check) } " " (variant(f.variant.as_deref())) }
                    td { (f.reason) }
                } } }
            }
        }
        h2 { "Flake rate on the base" }
        @if p.base_flake_rates.is_empty() { p.muted { "No base run has run the farm yet." } } @else {
            table.flakerate {
                thead { tr { th { "Check" } th.num { "Base runs" } th.num { "Flaky" } th.num { "Rate" } } }
                tbody { @for f in &p.base_flake_rates { tr {
                    td { code { (f.path) } " " (variant(f.variant.as_deref())) }
                    td.num { (f.runs) } td.num { (f.flaky) }
                    td.num { (format!("{:.0} %", f.rate * 100.0)) }
                } } }
            }
        }
        h2 { "Recent runs" }
        table.runs {
            thead { tr { th { "Run" } th { "Of" } th { "Worst" } th { "Results" } th { "Accel" } th { "Host" } th { "Started" } th.num { "Duration" } } }
            tbody { @for r in &p.runs { tr {
                td { a href=(site.page(&paths::run(&r.id))) { code { (r.id) } } @if r.state != "complete" { " " span.tag { (r.state) } } }
                td { @if let Some(rev) = &r.revision { a href=(site.page(&paths::revision_ref(rev))) { (rev) } } @else { span.muted { "base " (r.base) } } }
                td { (opt_status(r.worst)) }
                td.small { (counts(&r.counts)) }
                td { (r.accelerator) } td { (r.host) }
                td.nowrap { (time(r.started)) }
                td.num { @if let Some(d) = r.duration_s { (duration(d)) } @else { "–" } }
            } } }
        }
        h2 { "Farm check durations" }
        @if p.durations.is_empty() { p.muted { "No farm check has run yet." } } @else {
            table.durations {
                thead { tr { th { "Check" } th.num { "Attempts" } th.num { "Mean" } th.num { "Max" } th.num { "Not passed" } } }
                tbody { @for d in &p.durations { tr {
                    td { code { (d.path) } " " (variant(d.variant.as_deref())) }
                    td.num { (d.runs) } td.num { (duration(d.mean_s)) } td.num { (duration(d.max_s)) }
                    td.num { @if d.not_passed > 0 { span.fd.fd-still-failing { (d.not_passed) } } @else { "0" } }
                } } }
            }
        }
    };
    layout(
        Page {
            title: "Farm".into(),
            site,
            generated: p.generated,
            nav: "farm",
        },
        body,
    )
}

pub fn trends(site: &Site, p: &Trends) -> Markup {
    let body = html! {
        h1 { "Trends" }
        p.muted { "Each point is a revision's median over its runs' samples; the grey bar spans the base's samples, its line the base's median: what the call compares. "
            "Red points are regressions called by the Mann–Whitney test (p < 0.01, median at least 2.5 % worse), green improvements, blue within noise; each point's title says its call." }
        @if p.groups.is_empty() { p { "No measurements stored yet: they come from the farm's throughput and link-flap checks." } }
        @for g in &p.groups {
            h2 { a href=(site.page(&paths::series(&g.series))) { (g.series) } }
            div.charts {
                @for c in &g.charts {
                    figure.chart-box {
                        figcaption { span.tag { (c.kind) } " " code { (c.name) } " " (variant(c.variant.as_deref())) }
                        (line_chart(c))
                    }
                }
            }
        }
    };
    layout(
        Page {
            title: "Trends".into(),
            site,
            generated: p.generated,
            nav: "trends",
        },
        body,
    )
}

fn compare_form(site: &Site, revisions: &[String], a: Option<&str>, b: Option<&str>) -> Markup {
    html! {
        form.filters id="compare-form" action=(site.page("compare")) method="get" data-root=(site.root) data-ext=(site.ext) {
            label { "A " select name="a" { @for r in revisions { option value=(r) selected[Some(r.as_str()) == a] { (r) } } } }
            label { "B " select name="b" { @for r in revisions { option value=(r) selected[Some(r.as_str()) == b] { (r) } } } }
            button type="submit" { "Compare" }
        }
    }
}

pub fn compare_pick(site: &Site, p: &ComparePick) -> Markup {
    let last = p.pairs.last();
    let body = html! {
        h1 { "Compare two revisions" }
        (compare_form(site, &p.revisions, last.map(|x| x.0.as_str()), last.map(|x| x.1.as_str())))
        @if !p.pairs.is_empty() {
            h2 { "Each revision against the one before" }
            ul { @for (a, b) in &p.pairs { li { a href=(site.page(&paths::compare(a, b))) { (a) " → " (b) } } } }
        }
    };
    layout(
        Page {
            title: "Compare".into(),
            site,
            generated: p.generated,
            nav: "compare",
        },
        body,
    )
}

pub fn compare(site: &Site, p: &ComparePage, revisions: &[String]) -> Markup {
    let (a, b) = (&p.a, &p.b);
    let body = html! {
        h1 { "Compare " (a.reference) " and " (b.reference) }
        (compare_form(site, revisions, Some(&a.reference), Some(&b.reference)))
        table.side {
            thead { tr { th {} th { a href=(site.page(&paths::revision_ref(&a.reference))) { "A: " (a.reference) } } th { a href=(site.page(&paths::revision_ref(&b.reference))) { "B: " (b.reference) } } } }
            tbody {
                tr { th { "Verdict" } td { (verdict(a.state)) div.reason.small { (a.reason) } } td { (verdict(b.state)) div.reason.small { (b.reason) } } }
                tr { th { "Clock" } td { (a.clock.text) } td { (b.clock.text) } }
                tr { th { "Recorded" } td { (time(a.created)) } td { (time(b.created)) } }
                tr { th { "Runs" } td { (a.runs) } td { (b.runs) } }
                tr { th { "New failures vs base" } td { (a.new_failures) } td { (b.new_failures) } }
            }
        }
        h2 { "Patches" }
        table.side {
            thead { tr { th.num { "#" } th { "A" } th { "B" } th {} } }
            tbody { @for pp in &p.patches { tr {
                td.num { (pp.position) }
                td { @if let Some(s) = &pp.a { (s) } @else { span.muted { "–" } } }
                td { @if let Some(s) = &pp.b { (s) } @else { span.muted { "–" } } }
                td.small { @if pp.same_patch_id { span.muted { "same patch-id" } } @else { "changed" } }
            } } }
        }
        h2 { "Checks" }
        table.side {
            thead { tr { th { "Check" } th { "A" } th { "B" } th { "B against A" } } }
            tbody { @for c in &p.checks { tr class=[c.change.map(|_| "changed")] {
                td { code { (c.path) } " " (variant(c.variant.as_deref())) }
                td { (opt_status(c.a)) } td { (opt_status(c.b)) } td { (finding(c.change)) }
            } } }
        }
        h2 { "Measurements" }
        @if p.measurements.is_empty() { p.muted { "Neither revision has measurements." } } @else {
            table.side {
                thead { tr { th { "Measurement" } th.num { "A" } th.num { "B" } th.num { "Δ B vs A" } th.num { "Base samples" } } }
                tbody { @for m in &p.measurements { tr {
                    td { code { (m.name) } " " (variant(m.variant.as_deref())) }
                    td.num { @if let Some(v) = m.a { (human(v, &m.unit)) } @else { "–" } }
                    td.num { @if let Some(v) = m.b { (human(v, &m.unit)) } @else { "–" } }
                    td.num { (pct(m.delta_pct)) }
                    td.num { @if let Some(bd) = m.band { (human(bd.low, &m.unit)) " – " (human(bd.high, &m.unit)) } @else { "–" } }
                } } }
            }
        }
    };
    layout(
        Page {
            title: format!("{} vs {}", a.reference, b.reference),
            site,
            generated: p.generated,
            nav: "compare",
        },
        body,
    )
}

/// No store yet, or one without revisions: how to get the first results.
pub fn empty(site: &Site, store: &str, now: Timestamp, nav: &'static str) -> Markup {
    let body = html! {
        h1 { "No results yet" }
        div.empty {
            p { "The results store " code { (store) } " has no revision recorded yet. Run the first job:" }
            pre.cmd { "make run                      # images, then the shipped series end to end\n"
                      "phyfarm run patches/rust-phy-enum-check/v8   # or one revision" }
            p { "or record results you already have:" }
            pre.cmd { "phyfarm store import RESULTS.json" }
            p { "then reload this page (" code { "phyfarm serve" } "), or export it for GitHub Pages with "
                code { "phyfarm dashboard export DIR" } "." }
        }
    };
    layout(
        Page {
            title: "No results yet".into(),
            site,
            generated: now,
            nav,
        },
        body,
    )
}

/// A 404 or 500 page.
pub fn error(site: &Site, code: u16, message: &str, now: Timestamp) -> Markup {
    let title = match code {
        404 => "Not found",
        503 => "Store busy",
        _ => "Something went wrong",
    };
    let body = html! {
        h1 { (code) " · " (title) }
        p.error-msg { (message) }
        p { a href=(site.page("")) { "Back to the series list" } }
    };
    layout(
        Page {
            title: title.into(),
            site,
            generated: now,
            nav: "",
        },
        body,
    )
}
