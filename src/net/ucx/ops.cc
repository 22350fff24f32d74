#include "src/net/ucx/ops.h"

namespace reshard::net::ucx {
namespace {

void OnSent(void* request, ucs_status_t status, void* user_data) {
  ucp_request_free(request);
  static_cast<Completion*>(user_data)->Complete(status);
}

ucp_request_param_t Param(Completion* done, ucp_mem_h memh, uint32_t flags) {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.send = &OnSent;
  param.user_data = done;
  if (memh != nullptr) {
    param.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
    param.memh = memh;
  }
  if (flags != 0) {
    param.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = flags;
  }
  return param;
}

ucs_status_t Result(ucs_status_ptr_t request) {
  if (request == nullptr) return UCS_OK;
  if (UCS_PTR_IS_ERR(request)) return UCS_PTR_STATUS(request);
  return UCS_INPROGRESS;
}

}  // namespace

ucs_status_t Put(ucp_ep_h ep, const void* local, size_t bytes, uint64_t remote, ucp_rkey_h rkey,
                 ucp_mem_h memh, Completion* done) {
  const ucp_request_param_t param = Param(done, memh, 0);
  return Result(ucp_put_nbx(ep, local, bytes, remote, rkey, &param));
}

ucs_status_t SendAm(ucp_ep_h ep, unsigned id, const void* header, size_t header_bytes,
                    const void* data, size_t bytes, ucp_mem_h memh, Completion* done) {
  // REPLY: the receiver learns the endpoint a message arrived on and checks that it is the
  // endpoint of the rank the header names (src/net/wire.h).
  const ucp_request_param_t param =
      Param(done, memh, UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY);
  return Result(ucp_am_send_nbx(ep, id, header, header_bytes, data, bytes, &param));
}

ucs_status_t Flush(ucp_ep_h ep, Completion* done) {
  const ucp_request_param_t param = Param(done, nullptr, 0);
  return Result(ucp_ep_flush_nbx(ep, &param));
}

ucs_status_ptr_t StartClose(ucp_ep_h ep, bool force) {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  return ucp_ep_close_nbx(ep, &param);
}

}  // namespace reshard::net::ucx
