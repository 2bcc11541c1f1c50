// The HTTP side of the public protocol: bearer token, JSON in and out, typed errors.

/** An HTTP error answer ({code, message} as in docs/protocol.md), or a network failure. */
export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

export class Api {
  constructor(token, base = "") {
    this.token = token;
    this.base = base;
  }

  async request(method, path, params, body) {
    const url = new URL(this.base + path, location.href);
    for (const [name, value] of Object.entries(params || {})) {
      if (value !== null && value !== undefined && value !== "") url.searchParams.set(name, value);
    }
    let response;
    try {
      response = await fetch(url, {
        method,
        headers: {Authorization: `Bearer ${this.token}`, "Content-Type": "application/json"},
        body: body === undefined ? undefined : JSON.stringify(body),
        cache: "no-store",
      });
    } catch (error) {
      throw new ApiError(0, "network", `the gateway cannot be reached (${error.message})`);
    }
    let answer = null;
    try { answer = await response.json(); } catch { answer = null; }
    if (!response.ok) {
      throw new ApiError(response.status, answer?.code || "http",
        answer?.message || `${response.status} ${response.statusText}`);
    }
    return answer;
  }

  get(path, params) { return this.request("GET", path, params); }
  post(path, body = {}) { return this.request("POST", path, undefined, body); }
}
