//! The series list, one series, and one revision.

use maud::{html, Markup};
use phyfarm::verdict::State;

use super::{
    finding, layout, movement, opt_time, paths, pct, status, time, variant, verdict, Page, Site,
};
use crate::model::{CheckCell, Index, RevisionPage, RevisionSummary, SeriesGroup, SeriesPage};
use crate::text::human;

fn clock(r: &RevisionSummary) -> Markup {
    html! {
        span class={"clock clock-" (r.clock.kind)} {
            (r.clock.text)
            @if let Some(at) = r.clock.at {
                br; small { @if r.clock.kind == "time-left" { "at " } @else { "since " } (time(at)) }
            }
        }
    }
}

fn findings_summary(r: &RevisionSummary) -> Markup {
    html! {
        @if r.new_failures > 0 { span.fd.fd-new-failure { (r.new_failures) " new failure" @if r.new_failures > 1 { "s" } } " " }
        @if r.incomplete > 0 { span.fd.fd-incomplete { (r.incomplete) " incomplete" } " " }
        @if r.still_failing > 0 { span.fd.fd-still-failing { (r.still_failing) " still failing" } " " }
        @if r.fixed > 0 { span.fd.fd-fixed { (r.fixed) " fixed" } " " }
        @if r.new_warnings > 0 { span.fd.fd-new-warning { (r.new_warnings) " new warning" @if r.new_warnings > 1 { "s" } } " " }
        @if r.flaky > 0 { span.fd.fd-flaky { (r.flaky) " flaky" } }
        @if r.new_failures + r.incomplete + r.still_failing + r.fixed + r.new_warnings + r.flaky == 0 && r.runs > 0 {
            span.muted { "no new failure against the base" }
        }
    }
}

fn revision_row(site: &Site, r: &RevisionSummary) -> Markup {
    let state = r.state.map_or("none", State::name);
    let haystack = format!("{} {} {} {}", r.reference, r.title, r.author, r.reason).to_lowercase();
    html! {
        tr.rev data-state=(state) data-text=(haystack) {
            td.nowrap { a.revlink href=(site.page(&paths::revision(&r.series, r.version))) { "v" (r.version) } }
            td {
                div.subject { (r.title) @if r.patches > 1 { span.muted { " (+" (r.patches - 1) " more)" } } }
                div.muted.small { (r.author) }
            }
            td { (verdict(r.state)) div.reason.small { (r.reason) } }
            td.nowrap { (clock(r)) }
            td { (findings_summary(r)) }
            td.num {
                (r.runs)
                @if r.interrupted > 0 { br; span.small.muted { (r.interrupted) " interrupted" } }
            }
            td.nowrap {
                @if let Some(run) = &r.last_run {
                    a.small href=(site.page(&paths::run(run))) { "last run" }
                }
            }
        }
    }
}

fn revision_table(site: &Site, revs: &[RevisionSummary]) -> Markup {
    html! {
        table.revisions {
            thead { tr { th { "Rev" } th { "Subject / author" } th { "Verdict" } th { "72-hour clock" } th { "Against the base" } th.num { "Runs" } th {} } }
            tbody { @for r in revs { (revision_row(site, r)) } }
        }
    }
}

fn group(site: &Site, g: &SeriesGroup) -> Markup {
    html! {
        section.series-group data-series=(g.name) {
            h2 {
                a href=(site.page(&paths::series(&g.name))) { (g.name) }
                @if let Some(t) = &g.tree { " " span.tag { (t) } }
            }
            @if let Some(c) = &g.change_id { p.muted.small { "change-id " code { (c) } } }
            @if g.current.is_empty() {
                p.muted { "Every revision is superseded." }
            } @else {
                (revision_table(site, &g.current))
            }
            @if !g.superseded.is_empty() {
                details.superseded {
                    summary { (g.superseded.len()) " superseded revision" @if g.superseded.len() > 1 { "s" } }
                    (revision_table(site, &g.superseded))
                }
            }
        }
    }
}

pub fn index(site: &Site, idx: &Index) -> Markup {
    let states = [
        State::ChangesRequested,
        State::Testing,
        State::AwaitingReview,
        State::ReadyToMerge,
        State::New,
        State::Superseded,
    ];
    let body = html! {
        h1 { "Series" }
        div.summary-bar {
            @for s in states {
                @let n = idx.states.get(s.name()).copied().unwrap_or(0);
                @if n > 0 { span.count { (verdict(Some(s))) " " strong { (n) } } }
            }
        }
        form.filters id="filters" role="search" {
            label { "Search " input type="search" id="filter-q" name="q" placeholder="subject, author, v8…"; }
            label { "Verdict "
                select id="filter-state" name="state" {
                    option value="" { "any" }
                    @for s in states { option value=(s.name()) { (s.name()) } }
                }
            }
            label { input type="checkbox" id="filter-superseded" name="superseded"; " show superseded" }
            span.muted.small id="filter-count" {}
        }
        @for g in &idx.series { (group(site, g)) }
    };
    layout(
        Page {
            title: "Series".into(),
            site,
            generated: idx.generated,
            nav: "series",
        },
        body,
    )
}

pub fn series(site: &Site, p: &SeriesPage) -> Markup {
    let body = html! {
        p.crumbs { a href=(site.page("")) { "Series" } " / " (p.group.name) }
        (group(site, &p.group))
        h2 { "Verdict history" }
        @for (r, ts) in &p.history {
            h3 { a href=(site.page(&paths::revision_ref(r))) { (r) } }
            (transitions(ts))
        }
    };
    layout(
        Page {
            title: p.group.name.clone(),
            site,
            generated: p.generated,
            nav: "series",
        },
        body,
    )
}

fn transitions(ts: &[phyfarm::verdict::Transition]) -> Markup {
    html! {
        @if ts.is_empty() { p.muted { "No state recorded yet." } } @else {
            table.history {
                thead { tr { th { "When" } th { "State" } th { "Why" } } }
                tbody { @for t in ts { tr { td.nowrap { (time(t.at)) } td { (verdict(Some(t.state))) } td { (t.reason) } } } }
            }
        }
    }
}

/// A check's cell: status, then how it compares.
fn cell(site: &Site, c: &Option<CheckCell>) -> Markup {
    let Some(c) = c else {
        return html! { td.cell.none { "–" } };
    };
    let tip = format!(
        "base: {}; previous revision: {}",
        c.base.map_or("–", |s| s.name()),
        c.previous.map_or("–", |s| s.name())
    );
    let log = c.run.as_ref().map(|run| {
        format!(
            "{}#{}",
            site.page(&paths::run(run)),
            anchor(&c.path, c.variant.as_deref())
        )
    });
    html! {
        td.cell title=(tip) {
            div.line {
                (status(c.status))
                @if let Some(f) = &c.flaky { " " span.fd.fd-flaky title=(f) { "flaky" } }
                @if c.vs_base.is_some() { " " (finding(c.vs_base)) }
                @else if c.vs_previous.is_some() { " " (finding(c.vs_previous)) " " span.small.muted { "vs prev" } }
                @if let Some(href) = &log { " " a.small.log href=(href) { "log" } }
            }
            div.cmp {
                "base " (c.base.map_or("–", |s| s.name()))
                @if c.previous.is_some() { " · prev " (c.previous.map_or("–", |s| s.name())) }
            }
            @if !c.excerpt.is_empty() && c.status != phyfarm::results::Status::Pass {
                @let bad = matches!(c.status, phyfarm::results::Status::Fail | phyfarm::results::Status::Error);
                div class={ "excerpt" @if bad { " bad" } } { (c.excerpt.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or_default()) }
            }
            @if let Some(cmd) = &c.reproduce {
                div.small.repro { "reproduce: " code { (cmd) } }
            }
        }
    }
}

/// The id of a check's row on the run page.
pub fn anchor(path: &str, variant: Option<&str>) -> String {
    match variant {
        Some(v) => format!("check-{path}-{v}"),
        None => format!("check-{path}"),
    }
    .chars()
    .map(|c| {
        if c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_' {
            c
        } else {
            '_'
        }
    })
    .collect()
}

fn check_table(site: &Site, rows: &[CheckCell]) -> Markup {
    html! {
        table.checks {
            thead { tr { th { "Check" } th { "Result / base / previous" } } }
            tbody { @for c in rows { tr { td { code { (c.path) } " " (variant(c.variant.as_deref())) } (cell(site, &Some(c.clone()))) } } }
        }
    }
}

// Long: one maud template: the revision page's sections in the order they render.
pub fn revision(site: &Site, p: &RevisionPage) -> Markup {
    let s = &p.summary;
    let body = html! {
        p.crumbs {
            a href=(site.page("")) { "Series" } " / "
            a href=(site.page(&paths::series(&s.series))) { (s.series) } " / v" (s.version)
        }
        h1 { (s.title) }
        div.verdict-box {
            div { (verdict(s.state)) @if let Some(since) = s.since { " since " (time(since)) } }
            div.reason { (s.reason) }
            @for f in &p.first_bad { div.first-bad { "first bad patch: " (f) } }
            div { "72-hour clock: " (clock(s)) }
            div { (findings_summary(s)) }
        }
        dl.facts {
            dt { "Revision" } dd { code { (s.reference) } }
            @if let Some(t) = &p.tree { dt { "Tree" } dd { (t) } }
            @if let Some(b) = &p.base { dt { "Base" } dd { (b) } }
            @if let Some(c) = &s.change_id { dt { "change-id" } dd { code { (c) } } }
            @if let Some(m) = &p.message_id { dt { "Message-ID" } dd { code { "<" (m) ">" } } }
            dt { "patchset_hash" } dd { code.hash { (p.patchset_hash) } }
            dt { "Compared with" } dd {
                @if let Some(b) = &p.base_run { "base run " a href=(site.page(&paths::run(b))) { (b) } } @else { "no base run in this environment" }
                @if let Some(prev) = &p.previous {
                    "; previous revision " a href=(site.page(&paths::revision_ref(prev))) { (prev) }
                    " (" a href=(site.page(&paths::compare(prev, &s.reference))) { "compare" } ")"
                }
                @if let Some(next) = &p.next { "; superseded by " a href=(site.page(&paths::revision_ref(next))) { (next) } }
            }
        }

        h2 { "Patches: apply and build" }
        table.patches {
            thead { tr {
                th.num { "#" } th { "Subject / author / file" } th { "Apply" }
                @for v in &p.variants { th { "Build " span.variant { (v) } } }
            } }
            tbody {
                @for pr in &p.patches {
                    tr {
                        td.num { (pr.position) }
                        td {
                            div.subject { (pr.subject) }
                            div.small.muted { (pr.author) " <" (pr.author_email) ">" }
                            div.small { code { (pr.file) } }
                        }
                        (cell(site, &pr.apply))
                        @for b in &pr.builds { (cell(site, b)) }
                    }
                }
            }
        }

        h2 { "Rust gates" }
        @if p.gates.is_empty() { p.muted { "No gate ran." } } @else { (check_table(site, &p.gates)) }

        h2 { "Farm matrix" }
        @if p.farm.is_empty() { p.muted { "No farm check ran (the series did not build, or the farm has not run yet)." } } @else {
            table.matrix {
                thead { tr { th { "Check" } @for v in &p.variants { th { span.variant { (v) } } } } }
                tbody { @for row in &p.farm { tr { td { code { (row.check) } } @for c in &row.cells { (cell(site, c)) } } } }
            }
        }

        h2 { "Measurements" }
        @if p.measurements.is_empty() { p.muted { "No measurements." } } @else {
            table.measurements {
                thead { tr { th { "Measurement" } th.num { "This revision (median)" } th.num { "Base samples" } th.num { "Δ vs base median" } th { "Call" } th.num { "Previous revision" } } }
                tbody {
                    @for m in &p.measurements {
                        tr {
                            td { code { (m.name) } " " (variant(m.variant.as_deref())) }
                            td.num {
                                (human(m.value, &m.unit)) br;
                                span.small.muted { (m.samples) " samples" }
                                @if m.values.len() > 1 && m.values.len() <= 30 {
                                    br; span.small.muted.samples { @for (i, v) in m.values.iter().enumerate() { @if i > 0 { ", " } (human(*v, &m.unit)) } }
                                }
                            }
                            td.num {
                                @if let Some(b) = m.band {
                                    (human(b.low, &m.unit)) " – " (human(b.high, &m.unit)) br;
                                    span.small.muted { "median " (human(b.median, &m.unit)) ", " (b.samples) " samples" }
                                } @else { "–" }
                            }
                            td.num { (pct(m.delta_pct)) }
                            td { (movement(m.movement)) br; span.small.muted.call { (m.call) } }
                            td.num { @if let Some(v) = m.previous { (human(v, &m.unit)) } @else { "–" } }
                        }
                    }
                }
            }
            p.small.muted { "A regression is called when a one-sided Mann–Whitney test on the samples (at least 5 a side) gives p < 0.01 and the median is at least 2.5 % worse than the base's (half the 5 % loss the farm must catch); a throughput regression fails its check, and too few samples keep the revision testing. Each call says its effect, p, samples and the power its noise leaves for a 5 % loss; the values shown are the medians it compares, beside the base's lowest and highest sample." }
        }

        h2 { "New warnings" }
        @if p.warnings.is_empty() { p.muted { "No build added a warning." } } @else {
            table.warnings {
                thead { tr { th { "Build" } th { "Count" } th { "New lines" } } }
                tbody { @for w in &p.warnings { tr {
                    td { code { (w.build) } }
                    td { (w.detail) }
                    td { @if w.lines.is_empty() { span.muted { "–" } } @else { pre.log { @for l in &w.lines { (crate::text::strip_ansi(l)) "\n" } } } }
                } } }
            }
        }

        @if !p.other.is_empty() {
            h2 { "Other records" }
            (check_table(site, &p.other))
        }

        h2 { "Runs" }
        table.runs {
            thead { tr { th { "Run" } th { "State" } th { "Accelerator" } th { "Started" } th { "Finished" } } }
            tbody { @for r in &p.runs { tr {
                td { a href=(site.page(&paths::run(&r.id))) { code { (r.id) } } }
                td { (r.state) } td { (r.accelerator) } td { (time(r.started)) } td { (opt_time(r.finished)) }
            } } }
        }

        @if !p.reviews.is_empty() {
            h2 { "Reviews" }
            table { thead { tr { th { "When" } th { "Who" } th { "" } th { "Why" } } }
                tbody { @for r in &p.reviews { tr { td { (time(r.at)) } td { (r.by) } td { (r.kind.name()) } td { (r.reason) } } } } }
        }
        h2 { "Verdict history" }
        (transitions(&p.transitions))
    };
    layout(
        Page {
            title: s.reference.clone(),
            site,
            generated: p.generated,
            nav: "series",
        },
        body,
    )
}
