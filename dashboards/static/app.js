// phyfarm dashboard: list filters and the compare form. The pages are
// complete without this script; it only hides rows and builds a link.
"use strict";

function applyFilters() {
  const q = document.getElementById("filter-q");
  const st = document.getElementById("filter-state");
  const sup = document.getElementById("filter-superseded");
  if (!q || !st || !sup) return;
  const text = q.value.trim().toLowerCase();
  const state = st.value;
  let shown = 0;
  for (const row of document.querySelectorAll("tr.rev")) {
    const ok =
      (!text || (row.dataset.text || "").includes(text)) &&
      (!state || row.dataset.state === state);
    row.hidden = !ok;
    if (ok && !row.closest("details:not([open])")) shown += 1;
  }
  for (const d of document.querySelectorAll("details.superseded")) {
    d.open = sup.checked || state === "superseded";
  }
  for (const g of document.querySelectorAll("section.series-group")) {
    g.hidden = !g.querySelector("tr.rev:not([hidden])");
  }
  const count = document.getElementById("filter-count");
  if (count) count.textContent = text || state ? shown + " shown" : "";
  const params = new URLSearchParams();
  if (text) params.set("q", q.value.trim());
  if (state) params.set("state", state);
  if (sup.checked) params.set("superseded", "1");
  const search = params.toString();
  history.replaceState(null, "", search ? "?" + search : location.pathname);
}

function initFilters() {
  const form = document.getElementById("filters");
  if (!form) return;
  const params = new URLSearchParams(location.search);
  document.getElementById("filter-q").value = params.get("q") || "";
  document.getElementById("filter-state").value = params.get("state") || "";
  document.getElementById("filter-superseded").checked = params.has("superseded");
  form.addEventListener("input", applyFilters);
  form.addEventListener("change", applyFilters);
  form.addEventListener("submit", (e) => e.preventDefault());
  applyFilters();
}

function initCompare() {
  const form = document.getElementById("compare-form");
  if (!form) return;
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const seg = (r) => {
      const i = r.lastIndexOf("/");
      return encodeURIComponent(r.slice(0, i)) + "/" + encodeURIComponent(r.slice(i + 1));
    };
    const a = form.elements.a.value;
    const b = form.elements.b.value;
    location.href = form.dataset.root + "compare/" + seg(a) + "/" + seg(b) + form.dataset.ext;
  });
}

document.addEventListener("DOMContentLoaded", () => {
  initFilters();
  initCompare();
});
