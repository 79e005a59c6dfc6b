// The gpuir memory inspector: a static page over the service's own API routes.
// The key lives in this tab's sessionStorage only and travels in the Authorization header, never in a URL.
// Every datum is written with textContent or setAttribute, never parsed as HTML: no record can inject markup.
"use strict";

(function () {
  const KEY = "gpuir.inspector.key";
  const SVG = "http://www.w3.org/2000/svg";
  const $ = (id) => document.getElementById(id);
  const state = { key: null, tenant: null, operator: false, cursor: null, page: 0, poll: null };

  // ------------------------------------------------------------------ helpers
  function el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (cls) e.className = cls;
    return e;
  }

  function clear(node) {
    while (node.firstChild) node.removeChild(node.firstChild);
  }

  function showError(id, msg) {
    $(id).textContent = msg || "";
  }

  // The API's error as one line: a string detail as it is, a validation list as "loc: msg; ...".
  function errorText(status, body) {
    const d = body && body.detail;
    if (typeof d === "string") return d;
    if (Array.isArray(d)) {
      return d.map((e) => ((e.loc || []).join(".") + ": " + (e.msg || ""))).join("; ");
    }
    return "HTTP " + status;
  }

  class ApiError extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  }

  async function api(method, path, body) {
    const init = { method: method, headers: { Authorization: "Bearer " + state.key }, cache: "no-store",
                   referrerPolicy: "no-referrer", credentials: "omit" };
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const r = await fetch(path, init);
    let data = null;
    try {
      data = await r.json();
    } catch (e) {
      data = null;
    }
    if (!r.ok) throw new ApiError(r.status, errorText(r.status, data));
    return data;
  }

  function tenantPath(suffix) {
    return "/v1/tenants/" + encodeURIComponent(state.tenant) + suffix;
  }

  function fail(id, e) {
    if (e instanceof ApiError && e.status === 401) {
      signOut("Signed out: " + e.message);
      return;
    }
    showError(id, e instanceof ApiError ? e.message : String(e));
  }

  // ------------------------------------------------------------------ sign-in
  function tenantOfKey(key) {
    const parts = key.split(".");
    if (parts.length < 3 || parts[0] !== "gpuir" || !parts[1]) return null;
    return parts[1];
  }

  async function signIn(key) {
    showError("signin-error", "");
    const t = tenantOfKey(key);
    if (!t) {
      showError("signin-error", "not a gpuir service key (expected gpuir.TENANT.SECRET, as `gpuir serve-keys add` prints)");
      return;
    }
    state.key = key;
    state.operator = t === "_operator";
    try {
      if (state.operator) {
        const got = await api("GET", "/v1/tenants");
        const sel = $("scope");
        clear(sel);
        for (const x of got.tenants) {
          const o = el("option", x.tenant + " (" + x.records + ")");
          o.value = x.tenant;
          sel.appendChild(o);
        }
        state.tenant = got.tenants.length ? got.tenants[0].tenant : null;
        if (!state.tenant) throw new ApiError(404, "no tenant holds records yet");
        $("scope-label").hidden = false;
        $("who-text").textContent = "operator: every tenant";
      } else {
        state.tenant = t;
        const n = await api("GET", tenantPath("/count"));
        $("scope-label").hidden = true;
        $("who-text").textContent = "tenant " + t + " (" + n.count + " records)";
      }
    } catch (e) {
      state.key = null;
      showError("signin-error", e instanceof ApiError ? e.message : String(e));
      return;
    }
    sessionStorage.setItem(KEY, key);
    $("key").value = "";
    $("signin").hidden = true;
    $("who").hidden = false;
    $("app").hidden = false;
    resetViews();
  }

  function signOut(msg) {
    stopPoll();
    sessionStorage.removeItem(KEY);
    state.key = state.tenant = null;
    state.operator = false;
    $("app").hidden = true;
    $("who").hidden = true;
    $("signin").hidden = false;
    resetViews();
    showError("signin-error", msg || "");
  }

  function resetViews() {
    clear($("hits"));
    clear(document.querySelector("#records tbody"));
    for (const id of ["plot-time", "plot-sessions", "plot-segments"]) clear($(id));
    for (const id of ["search-error", "records-error", "memory-error", "search-status", "records-status",
                      "memory-status"]) showError(id, "");
    state.cursor = null;
    state.page = 0;
    $("records-next").disabled = true;
  }

  // ------------------------------------------------------------------ filters
  // The where of the filter boxes (null: none). Throws an Error naming a box that is not JSON.
  function buildWhere() {
    const w = {};
    const session = $("f-session").value.trim();
    const agent = $("f-agent").value.trim();
    const role = $("f-role").value;
    const from = $("f-from").value.trim();
    const to = $("f-to").value.trim();
    const meta = $("f-meta").value.trim();
    if (session) w.session = session;
    if (agent) w.agent = agent;
    if (role) w.role = role;
    if (from || to) {
      w.time = {};
      if (from) w.time.gte = from;
      if (to) w.time.lte = to;
    }
    if (meta) {
      let m;
      try {
        m = JSON.parse(meta);
      } catch (e) {
        throw new Error("metadata: not JSON (" + e.message + "); write an object such as {\"topic\": \"travel\"}");
      }
      w.metadata = m;
    }
    return Object.keys(w).length ? w : null;
  }

  // ------------------------------------------------------------------ search
  function fieldsOf(hit) {
    const skip = new Set(["id", "text", "score", "channels"]);
    const rows = [];
    for (const k of Object.keys(hit)) {
      if (skip.has(k)) continue;
      const v = hit[k];
      rows.push([k, typeof v === "string" ? v : JSON.stringify(v)]);
    }
    return rows;
  }

  function renderHit(hit, i) {
    const li = el("li", null, "hit");
    const head = el("div", null, "hit-head");
    head.appendChild(el("span", "#" + (i + 1), "rank"));
    head.appendChild(el("span", "score " + Number(hit.score).toFixed(4), "score"));
    head.appendChild(el("span", hit.id, "rid"));
    li.appendChild(head);
    li.appendChild(el("div", hit.text, "text"));
    const dl = el("dl", null, "fields");
    for (const [k, v] of fieldsOf(hit)) {
      dl.appendChild(el("dt", k));
      dl.appendChild(el("dd", v));
    }
    li.appendChild(dl);
    if (hit.channels && typeof hit.channels === "object") {
      const t = el("table", null, "channels");
      const hr = el("tr");
      for (const h of ["channel", "rank", "contribution"]) hr.appendChild(el("th", h));
      t.appendChild(hr);
      for (const name of Object.keys(hit.channels)) {
        const c = hit.channels[name] || {};
        const tr = el("tr");
        tr.appendChild(el("td", name));
        tr.appendChild(el("td", c.rank === null || c.rank === undefined ? "-" : c.rank));
        tr.appendChild(el("td", typeof c.contribution === "number" ? c.contribution.toFixed(5) : "-"));
        t.appendChild(tr);
      }
      li.appendChild(t);
    }
    return li;
  }

  async function search() {
    showError("search-error", "");
    $("search-status").textContent = "";
    clear($("hits"));
    const q = $("q").value.trim();
    if (!q) {
      showError("search-error", "type a question");
      return;
    }
    const body = { queries: [q], k: Number($("k").value) || 10 };
    const config = $("config").value.trim();
    if (config) {
      body.config = config;
      body.explain = true;  // each hit's channels: rank and contribution (when the configuration can say)
    }
    try {
      const w = buildWhere();
      if (w) body.where = w;
    } catch (e) {
      showError("search-error", e.message);
      return;
    }
    const t0 = performance.now();
    try {
      const got = await api("POST", tenantPath("/search"), body);
      const hits = got.results[0].hits;
      hits.forEach((h, i) => $("hits").appendChild(renderHit(h, i)));
      $("search-status").textContent = hits.length + " hits in " + Math.round(performance.now() - t0) + " ms";
    } catch (e) {
      fail("search-error", e);
    }
  }

  // ------------------------------------------------------------------ records
  function recordsQuery() {
    const p = new URLSearchParams();
    const w = buildWhere();
    if (w) p.set("where", JSON.stringify(w));
    p.set("order_by", $("r-order").value);
    p.set("descending", $("r-desc").checked ? "true" : "false");
    p.set("limit", String(Number($("r-limit").value) || 20));
    if (state.cursor) p.set("cursor", state.cursor);
    return p;
  }

  async function showHistory(id, row) {
    const next = row.nextSibling;
    if (next && next.classList && next.classList.contains("history")) {
      next.remove();
      return;
    }
    const tr = el("tr", null, "history");
    const td = el("td");
    td.colSpan = 6;
    tr.appendChild(td);
    row.after(tr);
    try {
      const got = await api("GET", tenantPath("/records/" + encodeURIComponent(id) + "/history"));
      if (!got.versions.length) td.appendChild(el("p", "no earlier versions"));
      got.versions.forEach((v, i) => {
        const d = el("div", null, "version");
        d.appendChild(el("strong", "version " + (i + 1) + ": "));
        d.appendChild(el("span", JSON.stringify(v)));
        td.appendChild(d);
      });
    } catch (e) {
      td.appendChild(el("p", e.message, "error"));
    }
  }

  async function listRecords(next) {
    showError("records-error", "");
    if (!next) {
      state.cursor = null;
      state.page = 0;
    }
    let p;
    try {
      p = recordsQuery();
    } catch (e) {
      showError("records-error", e.message);
      return;
    }
    try {
      const got = await api("GET", tenantPath("/records?" + p.toString()));
      const tbody = document.querySelector("#records tbody");
      clear(tbody);
      for (const r of got.records) {
        const tr = el("tr", null, "record");
        tr.appendChild(el("td", r.id, "rid"));
        tr.appendChild(el("td", r.time || ""));
        tr.appendChild(el("td", r.session || ""));
        tr.appendChild(el("td", r.role || ""));
        tr.appendChild(el("td", r.text, "text"));
        const td = el("td");
        const b = el("button", "history");
        b.type = "button";
        b.addEventListener("click", () => showHistory(r.id, tr));
        td.appendChild(b);
        tr.appendChild(td);
        tbody.appendChild(tr);
      }
      state.page += 1;
      state.cursor = got.cursor;
      $("records-next").disabled = !got.cursor;
      $("records-status").textContent = "page " + state.page + ": " + got.records.length + " records" +
        (got.cursor ? "" : " (last page)");
    } catch (e) {
      fail("records-error", e);
    }
  }

  // ------------------------------------------------------------------ plots (inline SVG)
  function svg(tag, attrs, text) {
    const e = document.createElementNS(SVG, tag);
    for (const k of Object.keys(attrs || {})) e.setAttribute(k, String(attrs[k]));
    if (text !== undefined) e.textContent = String(text);
    return e;
  }

  // Vertical bars: items [{label, value, title}], labels under the first and last bar.
  function barChart(items, width, height) {
    const s = svg("svg", { width: width, height: height + 36, viewBox: "0 0 " + width + " " + (height + 36),
                           role: "img" });
    const max = Math.max(1, ...items.map((x) => x.value));
    const left = 44;
    const bw = (width - left - 4) / Math.max(1, items.length);
    s.appendChild(svg("text", { x: left - 4, y: 12, "text-anchor": "end", class: "axis" }, max));
    s.appendChild(svg("text", { x: left - 4, y: height, "text-anchor": "end", class: "axis" }, 0));
    s.appendChild(svg("line", { x1: left, y1: height, x2: width, y2: height, class: "axis-line" }));
    items.forEach((x, i) => {
      const h = (x.value / max) * (height - 6);
      const r = svg("rect", { x: left + i * bw + 1, y: height - h, width: Math.max(1, bw - 2), height: h,
                              class: "bar" });
      r.appendChild(svg("title", {}, x.title));
      s.appendChild(r);
    });
    if (items.length) {
      s.appendChild(svg("text", { x: left, y: height + 16, class: "axis" }, items[0].label));
      s.appendChild(svg("text", { x: width, y: height + 32, "text-anchor": "end", class: "axis" },
                        items[items.length - 1].label));
    }
    return s;
  }

  // Horizontal bars, one labelled row each: items [{label, value, value2?}] (value2: a lighter bar behind).
  function rowChart(items, width) {
    const row = 18;
    const height = Math.max(1, items.length) * row + 4;
    const s = svg("svg", { width: width, height: height, viewBox: "0 0 " + width + " " + height, role: "img" });
    const left = 170;
    const max = Math.max(1, ...items.map((x) => Math.max(x.value, x.value2 || 0)));
    items.forEach((x, i) => {
      const y = i * row + 2;
      s.appendChild(svg("text", { x: left - 6, y: y + 12, "text-anchor": "end", class: "axis" },
                        x.label.length > 24 ? x.label.slice(0, 23) + "…" : x.label));
      if (x.value2 !== undefined) {
        s.appendChild(svg("rect", { x: left, y: y, height: row - 4, width: (x.value2 / max) * (width - left - 60),
                                    class: "bar2" }));
      }
      const r = svg("rect", { x: left, y: y, height: row - 4, width: Math.max(1, (x.value / max) * (width - left - 60)),
                              class: "bar" });
      r.appendChild(svg("title", {}, x.title || (x.label + ": " + x.value)));
      s.appendChild(r);
      s.appendChild(svg("text", { x: left + (Math.max(x.value, x.value2 || 0) / max) * (width - left - 60) + 4,
                                  y: y + 12, class: "axis" },
                        x.value2 !== undefined ? x.value + " / " + x.value2 : x.value));
    });
    return s;
  }

  async function refreshMemory() {
    showError("memory-error", "");
    try {
      const o = await api("GET", tenantPath("/overview"));
      $("memory-status").textContent = o.records + " records (" + o.untimed + " without a time), " +
        o.session_count + " sessions, " + o.segments.length + " segments" +
        (o.time_span ? ", " + o.time_span.min + " to " + o.time_span.max : "") +
        "; updated " + new Date().toLocaleTimeString();
      const pt = $("plot-time");
      clear(pt);
      const bins = o.over_time.map((b) => ({ label: b.start, value: b.records,
                                             title: b.start + " to " + b.end + ": " + b.records }));
      if (bins.length) bins[bins.length - 1].label = o.time_span.max;  // the newest record, not the span's end
      pt.appendChild(barChart(bins, 820, 140));
      const ps = $("plot-sessions");
      clear(ps);
      ps.appendChild(rowChart(o.sessions.map((x) => ({ label: x.session, value: x.records })), 820));
      const pg = $("plot-segments");
      clear(pg);
      pg.appendChild(rowChart(o.segments.map((x) => ({
        label: "segment " + x.uid,
        value: x.records, value2: x.stored,
        title: "segment " + x.uid + (x.partition === null ? ", no time partition" : ", partition " + x.partition) +
          ": " + x.records + " live of " + x.stored + " stored" })), 820));
    } catch (e) {
      fail("memory-error", e);
    }
  }

  // Polling: the next refresh is due a second after the last one answered, so a slow server never has
  // more than one of this page's requests in flight.
  async function pollLoop() {
    if (!state.poll) return;
    await refreshMemory();
    if (state.poll) state.poll = setTimeout(pollLoop, 1000);
  }

  function stopPoll() {
    if (state.poll) clearTimeout(state.poll);
    state.poll = null;
    $("memory-poll").checked = false;
  }

  // ------------------------------------------------------------------ wiring
  function showTab(id) {
    for (const b of document.querySelectorAll(".tab")) b.setAttribute("aria-pressed", String(b.dataset.tab === id));
    for (const p of document.querySelectorAll(".tab-panel")) p.hidden = p.id !== id;
    if (id === "memory-tab") refreshMemory();
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("signin-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      signIn($("key").value.trim());
    });
    $("signout").addEventListener("click", () => signOut(""));
    $("scope").addEventListener("change", () => {
      state.tenant = $("scope").value;
      resetViews();
      if (!$("memory-tab").hidden) refreshMemory();
    });
    for (const b of document.querySelectorAll(".tab")) b.addEventListener("click", () => showTab(b.dataset.tab));
    $("search-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      search();
    });
    $("records-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      listRecords(false);
    });
    $("records-next").addEventListener("click", () => listRecords(true));
    $("memory-button").addEventListener("click", refreshMemory);
    $("memory-poll").addEventListener("change", () => {
      if ($("memory-poll").checked) {
        if (!state.poll) state.poll = setTimeout(pollLoop, 1000);
      } else {
        stopPoll();
      }
    });
    const saved = sessionStorage.getItem(KEY);
    if (saved) signIn(saved);
  });
})();
