/* Study pages: the start form on /studies, live progress and cancel on /studies/{id}.
 *
 * The form POSTs {"builtin", "seeds", "quick"} to /v1/studies and follows the new study.
 * A queued or running study's page polls GET /v1/studies/{id} every second (as the
 * comparison page does), moves its bar and counts the trainings, and reloads itself once
 * the study has ended so that the plot and the table of arms appear. */
(function () {
  "use strict";

  const $ = function (id) { return document.getElementById(id); };
  const STATES = window.cka.states;
  const LIVE = STATES.LIVE;

  const form = $("new-study");
  if (form) {
    const submit = $("start-study");
    const formError = $("form-error");
    form.addEventListener("submit", async function (event) {
      event.preventDefault();
      form.querySelectorAll(".field-error").forEach(function (e) { e.textContent = ""; });
      formError.textContent = "";
      const data = new FormData(form);
      const payload = {
        builtin: String(data.get("builtin")),
        seeds: parseInt(String(data.get("seeds") || "0"), 10),
        quick: data.get("quick") !== null,
      };
      submit.disabled = true;
      submit.textContent = "Starting…";
      try {
        const res = await window.cka.api("POST", "/v1/studies", payload);
        window.location.assign("/studies/" + res.data.id);
        return;
      } catch (e) {
        const p = e.problem || {};
        const field = String(p.field || "").split(".")[0];
        const slot = form.querySelector('.field-error[data-for="' + field + '"]');
        if (e.status === 401) formError.textContent = "Sign in with an API token to start studies.";
        else if (slot) slot.textContent = p.detail || e.message;
        else formError.textContent = p.detail || e.message;
      }
      submit.disabled = false;
      submit.textContent = "Start study";
    });
  }

  const metaNode = $("study-meta");
  if (!metaNode) return;
  const meta = JSON.parse(metaNode.textContent);
  const url = "/v1/studies/" + meta.id;

  const cancel = $("cancel");
  if (cancel) {
    cancel.addEventListener("click", async function () {
      cancel.disabled = true;
      try { await window.cka.api("POST", url + "/cancel"); } catch (e) { cancel.disabled = false; }
    });
  }

  function label(view) {
    if (view.status === STATES.QUEUED) return "Waiting for a worker";
    if (view.stage === "trainings") return "Training";
    if (view.stage === "comparison") return "Computing the atlas";
    return "Summarising";
  }

  // Each training's row: its job's state pill and the worker running it (the worker id's
  // first part, its name), as the server renders them.
  function showTrainings(members) {
    members.forEach(function (m) {
      const row = document.querySelector('tr[data-key="' + m.training_key + '"]');
      if (!row || !m.status) return;
      let pill = row.querySelector(".training-state .pill");
      if (!pill) {
        pill = document.createElement("span");
        const cell = row.querySelector(".training-state");
        cell.textContent = "";
        cell.appendChild(pill);
      }
      window.cka.setStatus(pill, m.status);
      row.querySelector(".training-worker").textContent = (m.worker || "—").split(":")[0];
    });
  }

  async function poll() {
    let view;
    try {
      view = (await window.cka.api("GET", url)).data;
    } catch (e) {
      window.setTimeout(poll, 2000);
      return;
    }
    window.cka.setStatus(document.querySelector("#status-pill .pill"), view.status);
    window.cka.setProgress($("progress"), view.progress);
    const t = view.trainings;
    $("progress-label").textContent = label(view);
    showTrainings(view.models || []);
    $("progress-text").textContent = "trainings " + t.done + " of " + t.total + " (" + t.reused +
      " reused) · " + Math.round(view.progress * 100) + " %";
    if (LIVE.indexOf(view.status) < 0) {
      window.location.reload();
      return;
    }
    window.setTimeout(poll, 1000);
  }

  if (LIVE.indexOf(meta.status) >= 0) window.setTimeout(poll, 1000);
})();
