/* The Jobs page: cancel buttons, and live state and progress of the jobs that may still change. */
(function () {
  "use strict";

  function liveStates() {
    const table = document.querySelector("table.jobs");
    return table ? table.getAttribute("data-live-states").split(" ") : [];
  }

  function show(message) {
    const box = document.getElementById("jobs-message");
    if (!box) return;
    box.textContent = message;
    box.hidden = false;
  }

  async function refresh(row, live) {
    const id = row.getAttribute("data-job-id");
    try {
      const job = (await window.cka.api("GET", "/v1/jobs/" + id)).data;
      window.cka.setStatus(row.querySelector(".pill"), job.status);
      window.cka.setProgress(row.querySelector(".progress"), job.progress);
      if (!live.includes(job.status) || job.cancel_requested) {
        const button = row.querySelector("button[data-cancel]");
        if (button) button.remove();
      }
      return live.includes(job.status);
    } catch (e) {
      return true; /* a blip: try again on the next round */
    }
  }

  async function loop(rows, live) {
    const still = await Promise.all(rows.map(function (r) { return refresh(r, live); }));
    const next = rows.filter(function (_, i) { return still[i]; });
    if (next.length) window.setTimeout(function () { loop(next, live); }, 1500);
  }

  async function cancel(button) {
    const id = button.getAttribute("data-cancel");
    if (!window.confirm("Cancel job " + id + "? It stops once nobody else holds it, its parts with it.")) return;
    button.disabled = true;
    try {
      const job = (await window.cka.api("POST", "/v1/jobs/" + id + "/cancel")).data;
      button.remove();
      const others = (job.held_by || []).map(function (h) { return h.label || h.requester; });
      show(others.length
        ? "Job " + id + ": you no longer hold it; it carries on for " + others.join(", ") + "."
        : "Job " + id + ": cancel requested.");
    } catch (e) {
      button.disabled = false;
      show(e.status === 401 ? "Sign in to cancel jobs." : e.message);
    }
  }

  document.addEventListener("DOMContentLoaded", function () {
    const live = liveStates();
    document.querySelectorAll("button[data-cancel]").forEach(function (b) {
      b.addEventListener("click", function () { cancel(b); });
    });
    const rows = Array.from(document.querySelectorAll("tr[data-job-id]")).filter(function (r) {
      return r.querySelector(".progress.live");
    });
    if (rows.length) window.setTimeout(function () { loop(rows, live); }, 1000);
  });
})();
