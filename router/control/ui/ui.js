// spec-router's live page: reads /router/ui/events (one snapshot a second) and draws it.
// Read-only: it sends nothing but that GET. No build step: plain browser JavaScript + uPlot.
"use strict";

(function () {
  const SPEC = "speculative", BASE = "baseline", POOLS = [SPEC, BASE];
  const COLOR = { speculative: "#d9480f", baseline: "#1c7ed6", capacity: "#495057" };
  const HISTORY = 300; // points of the in-flight chart kept on the page (5 min at 1/s)

  // A key given as ?key= is now a cookie (see router/control/page.py): keep it out of sight.
  if (location.search.includes("key=")) window.history.replaceState(null, "", location.pathname);

  const $ = (id) => document.getElementById(id);
  const text = (id, value) => { const el = $(id); if (el) el.textContent = value; };
  const fmt = (v, digits = 0) => (v === null || v === undefined ? "–" : Number(v).toFixed(digits));
  const ms = (v) => (v === null || v === undefined ? "–" : v < 10 ? v.toFixed(2) + " ms" : v < 1000 ? v.toFixed(0) + " ms" : (v / 1000).toFixed(2) + " s");
  const pct = (v) => (v === null || v === undefined ? "–" : (v * 100).toFixed(1) + "%");

  function cell(row, value, cls) {
    const td = document.createElement("td");
    td.textContent = value;
    if (cls) td.className = cls;
    row.appendChild(td);
    return td;
  }

  function fill(tableId, rows) {
    const body = $(tableId).querySelector("tbody");
    body.replaceChildren(...rows);
  }

  // -- charts ----------------------------------------------------------------------------------
  const charts = {};
  const trail = { t: [], spec: [], base: [], cap: [] }; // the in-flight chart's points

  function width(el) { return Math.max(300, el.clientWidth - 4); }

  function makeCharts() {
    const inflightEl = $("chart-inflight");
    charts.inflight = new uPlot({
      width: width(inflightEl), height: 240, legend: { live: false },
      scales: { x: { time: true }, y: { range: (u, lo, hi) => [0, Math.max(4, hi * 1.15)] } },
      axes: [{}, { label: "requests in flight" }],
      series: [
        {},
        { label: "speculative", stroke: COLOR.speculative, width: 2 },
        { label: "baseline", stroke: COLOR.baseline, width: 2 },
        { label: "crossover × engines", stroke: COLOR.capacity, dash: [6, 4], width: 1.5 },
      ],
    }, [[], [], [], []], inflightEl);

    const shareEl = $("chart-share");
    charts.share = new uPlot({
      width: width(shareEl), height: 240, legend: { live: false },
      scales: { x: { time: false }, y: { range: (u, lo, hi) => [0, Math.max(1, hi * 1.15)] }, pct: { range: [0, 100] } },
      axes: [
        { label: "seconds ago", values: (u, vals) => vals.map((v) => String(-Math.round(v))) },
        { label: "requests" },
        { scale: "pct", side: 1, label: "% to speculative", grid: { show: false } },
      ],
      series: [
        {},
        { label: "speculative", stroke: COLOR.speculative, fill: COLOR.speculative + "22", width: 2 },
        { label: "baseline", stroke: COLOR.baseline, fill: COLOR.baseline + "22", width: 2 },
        { label: "% to speculative", stroke: "#2b8a3e", scale: "pct", width: 2, spanGaps: false },
      ],
    }, [[], [], [], []], shareEl);

    const curvesEl = $("chart-curves");
    const dots = (stroke) => ({ stroke, fill: stroke, width: 0, paths: () => null, points: { show: true, size: 11, fill: stroke } });
    charts.curves = new uPlot({
      width: width(curvesEl), height: 300, legend: { live: false },
      scales: { x: { time: false, distr: 3, log: 2 }, y: { range: (u, lo, hi) => [0, Math.max(1, hi * 1.1)] } },
      axes: [{ label: "concurrent requests per engine" }, { label: "tok/s per request" }],
      series: [
        {},
        { label: "speculative, start", stroke: COLOR.speculative, dash: [6, 4], width: 1.5, spanGaps: true },
        { label: "speculative, learned", stroke: COLOR.speculative, width: 2.5, spanGaps: true },
        { label: "baseline, start", stroke: COLOR.baseline, dash: [6, 4], width: 1.5, spanGaps: true },
        { label: "baseline, learned", stroke: COLOR.baseline, width: 2.5, spanGaps: true },
        Object.assign({ label: "speculative now" }, dots(COLOR.speculative)),
        Object.assign({ label: "baseline now" }, dots(COLOR.baseline)),
      ],
      hooks: { draw: [drawCrossover] },
    }, [[1], [null], [null], [null], [null], [null], [null]], curvesEl);

    window.addEventListener("resize", () => {
      charts.inflight.setSize({ width: width(inflightEl), height: 240 });
      charts.share.setSize({ width: width(shareEl), height: 240 });
      charts.curves.setSize({ width: width(curvesEl), height: 300 });
    });
  }

  let crossoverMark = null; // {value, source}

  function drawCrossover(u) {
    if (!crossoverMark || crossoverMark.value < 1) return;
    const x = u.valToPos(crossoverMark.value, "x", true);
    if (!isFinite(x) || x < u.bbox.left || x > u.bbox.left + u.bbox.width) return;
    const ctx = u.ctx;
    ctx.save();
    ctx.strokeStyle = COLOR.capacity;
    ctx.setLineDash([3, 3]);
    ctx.lineWidth = 1.5;
    ctx.beginPath();
    ctx.moveTo(x, u.bbox.top);
    ctx.lineTo(x, u.bbox.top + u.bbox.height);
    ctx.stroke();
    ctx.fillStyle = COLOR.capacity;
    ctx.font = 12 * devicePixelRatio + "px sans-serif";
    const what = crossoverMark.none ? " no crossover up to " : " crossover ";
    ctx.fillText(what + crossoverMark.value + " (" + crossoverMark.source + ")", x, u.bbox.top + 14 * devicePixelRatio);
    ctx.restore();
  }

  function curveData(curves) {
    const start = curves.start || {};
    const learned = curves.learned || {};
    const op = curves.operating || {};
    const lines = [start[SPEC], learned[SPEC], start[BASE], learned[BASE]].map((pts) => pts || []);
    const opPts = POOLS.map((p) => (op[p] || []).filter((o) => o.tps !== null).map((o) => [Math.max(1, o.load), o.tps]));
    const xs = new Set();
    lines.concat(opPts).forEach((pts) => pts.forEach((p) => xs.add(p[0])));
    if (curves.crossover >= 1) xs.add(curves.crossover);
    const sorted = Array.from(xs).sort((a, b) => a - b);
    if (!sorted.length) sorted.push(1);
    const column = (pts) => {
      const at = new Map();
      pts.forEach((p) => { if (!at.has(p[0])) at.set(p[0], p[1]); });
      return sorted.map((x) => (at.has(x) ? at.get(x) : null));
    };
    return [sorted, ...lines.map(column), ...opPts.map(column)];
  }

  // -- one snapshot ------------------------------------------------------------------------------
  function engines(pool, key) {
    const values = pool.backends.map((b) => b[key]).filter((v) => v !== null && v !== undefined);
    return values.length ? values.reduce((a, b) => a + b, 0) : null;
  }

  function render(s) {
    const spec = s.pools[SPEC], base = s.pools[BASE];
    text("policy", s.policy);
    text("load-signal", s.load_signal);
    // null: none measured (the baseline never caught up within the levels measured)
    const none = s.no_crossover;
    text("crossover", none ? "none up to " + none.measured_up_to : s.crossover);
    $("crossover").dataset.value = none ? "" : s.crossover;
    $("crossover").title = none ? none.reason : "";
    text("crossover-source", s.crossover_source);
    text("advice", none ? none.advice : "");
    $("advice").hidden = !none;
    const l = s.learning || {};
    text("learning", !l.enabled ? "off" : l.pinned ? "pinned" : "on");
    text("slo", s.slo ? "SLO TTFT " + s.slo.ttft_ms + " ms · TPOT " + s.slo.tpot_ms + " ms" : "");
    text("inflight-speculative", spec.in_flight);
    $("inflight-speculative").dataset.value = spec.in_flight;
    text("inflight-baseline", base.in_flight);
    $("inflight-baseline").dataset.value = base.in_flight;
    text("capacity", s.speculative_capacity);
    text("running-speculative", fmt(engines(spec, "running")));
    text("queued-speculative", fmt(engines(spec, "queued")));
    text("running-baseline", fmt(engines(base, "running")));
    text("queued-baseline", fmt(engines(base, "queued")));
    const r = s.recent;
    text("share", pct(r.share_speculative));
    $("share").dataset.value = r.share_speculative === null ? "" : r.share_speculative;
    const finished = Object.values(r.requests).reduce((a, b) => a + b, 0);
    text("requests", finished);
    const minutes = Math.round(r.window_s / 60);
    document.querySelectorAll(".window").forEach((el) => { el.textContent = minutes + " min"; });
    document.querySelectorAll(".bucket").forEach((el) => { el.textContent = r.series.bucket_s + " s"; });
    text("accept", l.acceptance_length ? l.acceptance_length.toFixed(2) : "–");
    text("target", l.target === null || l.target === undefined ? "–" : l.target);

    // latency
    fill("latency", POOLS.map((p) => {
      const row = document.createElement("tr");
      const x = r.latency[p];
      cell(row, p, "pool-" + p);
      [x.ttft_p50_ms, x.ttft_p90_ms, x.tpot_p50_ms, x.tpot_p90_ms].forEach((v) => cell(row, ms(v), "num"));
      cell(row, x.ttft_n, "num");
      return row;
    }));
    // reasons
    const routed = POOLS.reduce((a, p) => a + (r.requests[p] || 0), 0);
    const reasonRows = [];
    POOLS.forEach((p) => Object.entries(r.reasons[p] || {}).forEach(([reason, n]) => {
      const row = document.createElement("tr");
      cell(row, p, "pool-" + p);
      cell(row, reason);
      cell(row, n, "num");
      cell(row, routed ? pct(n / routed) : "–", "num");
      reasonRows.push(row);
    }));
    fill("reasons", reasonRows);
    // backends
    const rows = [];
    POOLS.forEach((p) => s.pools[p].backends.forEach((b) => {
      const row = document.createElement("tr");
      cell(row, p, "pool-" + p);
      cell(row, b.url);
      cell(row, b.state + (b.usable ? "" : " (not usable)"), "state-" + b.state);
      cell(row, b.in_flight, "num");
      cell(row, b.load, "num");
      cell(row, fmt(b.running), "num");
      cell(row, fmt(b.queued), "num");
      cell(row, b.accept_length ? b.accept_length.toFixed(2) : "–", "num");
      cell(row, b.weight.toFixed(2), "num");
      cell(row, b.ejected_for_s > 0 ? b.ejected_for_s.toFixed(1) + " s" : b.ejections ? "× " + b.ejections : "–", "num");
      cell(row, b.last_error || "", "err");
      rows.push(row);
    }));
    fill("backends", rows);

    // charts
    const now = Date.now() / 1000;
    trail.t.push(now); trail.spec.push(spec.in_flight); trail.base.push(base.in_flight); trail.cap.push(s.speculative_capacity);
    if (trail.t.length > HISTORY) Object.values(trail).forEach((a) => a.shift());
    charts.inflight.setData([trail.t, trail.spec, trail.base, trail.cap]);
    const series = r.series;
    const shares = series.t.map((_, i) => {
      const n = series[SPEC][i] + series[BASE][i];
      return n ? (100 * series[SPEC][i]) / n : null;
    });
    charts.share.setData([series.t, series[SPEC], series[BASE], shares]);
    const c = s.curves;
    crossoverMark = { value: c.crossover, source: s.crossover_source, none: !!none };
    charts.curves.setData(curveData(c));
    text("start-label", c.start ? "starting (" + c.start_source + ")" : "starting (none loaded)");
    text("curve-units", c.time_scale !== 1 ? "· tok/s in model time (engines run at time scale " + c.time_scale + ")" : "");

    renderPlan(s.plan);

    text("updated", "updated " + new Date().toLocaleTimeString() + " · #" + s.seq);
    document.body.dataset.seq = s.seq;
  }

  // -- the fleet plan (GET /router/plan, when the planner is on) -----------------------------------
  const split = (x) => (x ? x[SPEC] + " speculative + " + x[BASE] + " baseline" : "–");
  const points = (v) => (v === null || v === undefined ? "–" : (v >= 0 ? "+" : "") + (100 * v).toFixed(2) + " pt");

  function renderPlan(p) {
    $("plan").hidden = !p;
    if (!p) return;
    text("plan-mode", p.planner);
    text("plan-status", p.status === "planning" ? "" : p.status);
    text("plan-current", split(p.current || p.running));
    text("plan-desired", split(p.desired));
    text("plan-targets", split(p.targets));
    const sw = p.switch;
    text("plan-switch", sw ? "#" + sw.id + " " + sw.engine + " " + sw.from + " → " + sw.into + " (" + sw.phase + ")" : "none");
    text("plan-rate", p.rate === null || p.rate === undefined ? "–" : p.rate.toFixed(2) + " req/s");
    text("plan-forecast", p.forecast ? p.forecast.point.toFixed(2) + " (upper " + p.forecast.upper.toFixed(2) + ")" : "–");
    const n = p.next_switch;
    text("plan-next", n ? "→ " + n.into + ": gain " + points(n.gain) + ", cost " + points(n.cost) + (n.blocked ? " · " + n.blocked : "") : "–");
    text("plan-reason", p.reason || "");
    $("plan-history").replaceChildren(...(p.history || []).map((d) => {
      const li = document.createElement("li");
      li.textContent = new Date(d.at * 1000).toLocaleTimeString() + " · " + d.reason;
      return li;
    }));
  }

  // -- the feed ----------------------------------------------------------------------------------
  function connect() {
    const base = location.pathname.endsWith("/") ? location.pathname : location.pathname + "/";
    const source = new EventSource(base + "events");
    source.onopen = () => { text("conn", "live"); $("conn").className = "tag live"; };
    source.onerror = () => { text("conn", "reconnecting"); $("conn").className = "tag down"; };
    source.onmessage = (ev) => render(JSON.parse(ev.data));
    // Closing the tab closes the stream; say so early too, so the router lets go at once.
    window.addEventListener("pagehide", () => source.close());
  }

  makeCharts();
  window.specRouterCharts = charts; // for a look from the browser's console (and the tests)
  connect();
})();
