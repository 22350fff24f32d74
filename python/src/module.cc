// reshard._reshard: the Python bindings of the public C++ API (reshard/reshard.h), built with
// nanobind. The package reshard/ (python/reshard/) wraps this module: it turns torch tensors,
// DTensors and DLPack arrays into buffers, builds layouts from DTensors and adapts
// torch.distributed stores; docs/python.md is the user's guide.
//
// Errors: every absl::Status that is not OK becomes the Python exception of its code, defined in
// reshard/errors.py (InvalidArgumentError is also a ValueError, DeadlineExceededError a
// TimeoutError, ...), with the library's one-sentence message unchanged.
//
// The GIL is released around everything that blocks (connecting, Create, Execute, Wait, Barrier,
// destroying a handle), so a refit can run on a Python thread beside other work. Store callbacks
// written in Python take the GIL back while they run.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "reshard/reshard.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

// A non-OK status on its way to Python; the translator below raises reshard.errors' class.
struct StatusError {
  absl::Status status;
};

// The exception classes of reshard/errors.py, indexed by absl::StatusCode (0..16).
std::array<PyObject*, 17> g_error_classes{};

void Check(const absl::Status& status) {
  if (!status.ok()) throw StatusError{status};
}

template <typename T>
T Value(absl::StatusOr<T> value) {
  if (!value.ok()) throw StatusError{value.status()};
  return *std::move(value);
}

// Seconds from Python (a float; None or inf: no deadline beyond the library's defaults) to an
// absolute deadline. Negative or NaN timeouts are the caller's mistake.
absl::Time DeadlineIn(double seconds, const char* what) {
  if (std::isnan(seconds) || seconds < 0) {
    throw nb::value_error((std::string(what) + " must be a number of seconds >= 0").c_str());
  }
  if (std::isinf(seconds)) return absl::InfiniteFuture();
  return absl::Now() + absl::Seconds(seconds);
}

absl::Duration Seconds(double seconds, const char* what) {
  if (std::isnan(seconds) || seconds <= 0) {
    throw nb::value_error((std::string(what) + " must be a number of seconds > 0").c_str());
  }
  if (std::isinf(seconds)) return absl::InfiniteDuration();
  return absl::Seconds(seconds);
}

// A Python callable kept alive by C++ code that may run without the GIL (store callbacks,
// called from Communicator::Impl on whatever thread runs set-up): copies and the final release
// take the GIL, calls take it for their duration.
class PyCallable {
 public:
  explicit PyCallable(nb::object fn) : fn_(new nb::object(std::move(fn)), Release) {}
  bool empty() const { return !fn_ || fn_->is_none(); }
  template <typename... Args>
  nb::object operator()(Args&&... args) const {
    nb::gil_scoped_acquire gil;
    return (*fn_)(std::forward<Args>(args)...);
  }

 private:
  static void Release(nb::object* fn) {
    if (!Py_IsInitialized()) {
      // The interpreter is gone (a handle destroyed at exit): leak the reference.
      return;
    }
    nb::gil_scoped_acquire gil;
    delete fn;
  }
  std::shared_ptr<nb::object> fn_;
};

// The status a Python exception raised by a store callback stands for: DeadlineExceeded for
// TimeoutError (and reshard's own DeadlineExceededError), else Unavailable; the message names
// the callback and keeps the exception's type and text. Called with the GIL held (the
// python_error is released in the caller's scope, which holds it too).
absl::Status FromPythonError(nb::python_error& e, const char* callback) {
  const bool timeout = e.matches(PyExc_TimeoutError);
  std::string message = std::string("store callback ") + callback + " raised " +
                        nb::cast<std::string>(nb::handle(e.type()).attr("__name__")) + ": " +
                        nb::cast<std::string>(nb::str(e.value()));
  return timeout ? absl::DeadlineExceededError(message) : absl::UnavailableError(message);
}

std::string BytesOf(const nb::handle& value, const char* callback) {
  if (nb::isinstance<nb::bytes>(value)) {
    nb::bytes b = nb::borrow<nb::bytes>(value);
    return std::string(b.c_str(), b.size());
  }
  if (nb::isinstance<nb::str>(value)) return nb::cast<std::string>(value);
  throw nb::type_error(
      (std::string("store callback ") + callback + " must return bytes or str").c_str());
}

reshard::StoreCallbacks MakeStoreCallbacks(nb::object set, nb::object get, nb::object list,
                                           nb::object del) {
  reshard::StoreCallbacks cb;
  PyCallable py_set(std::move(set)), py_get(std::move(get)), py_list(std::move(list)),
      py_del(std::move(del));
  cb.set = [py_set](const std::string& key, const std::string& value) -> absl::Status {
    nb::gil_scoped_acquire gil;
    try {
      py_set(nb::str(key.data(), key.size()), nb::bytes(value.data(), value.size()));
      return absl::OkStatus();
    } catch (nb::python_error& e) {
      return FromPythonError(e, "set");
    }
  };
  cb.get = [py_get](const std::string& key, absl::Time deadline) -> absl::StatusOr<std::string> {
    nb::gil_scoped_acquire gil;
    try {
      const double timeout = std::max(0.0, absl::ToDoubleSeconds(deadline - absl::Now()));
      nb::object value = py_get(nb::str(key.data(), key.size()), timeout);
      if (value.is_none()) {
        return absl::DeadlineExceededError("store key \"" + key + "\" was not set in time");
      }
      return BytesOf(value, "get");
    } catch (nb::python_error& e) {
      return FromPythonError(e, "get");
    } catch (nb::builtin_exception& e) {
      return absl::InvalidArgumentError(e.what());
    }
  };
  if (!py_list.empty()) {
    cb.list = [py_list](const std::string& prefix)
        -> absl::StatusOr<std::vector<std::pair<std::string, std::string>>> {
      nb::gil_scoped_acquire gil;
      try {
        std::vector<std::pair<std::string, std::string>> out;
        for (nb::handle item : py_list(nb::str(prefix.data(), prefix.size()))) {
          nb::tuple kv = nb::borrow<nb::tuple>(item);
          out.emplace_back(nb::cast<std::string>(kv[0]), BytesOf(kv[1], "list"));
        }
        return out;
      } catch (nb::python_error& e) {
        return FromPythonError(e, "list");
      } catch (std::exception& e) {
        return absl::InvalidArgumentError(std::string("store callback list: ") + e.what());
      }
    };
  }
  if (!py_del.empty()) {
    cb.del = [py_del](const std::string& key) -> absl::Status {
      nb::gil_scoped_acquire gil;
      try {
        py_del(nb::str(key.data(), key.size()));
        return absl::OkStatus();
      } catch (nb::python_error& e) {
        return FromPythonError(e, "delete");
      }
    };
  }
  return cb;
}

// A refit handle with the Python objects whose memory it refits (kept alive as long as the
// handle: the library writes into and reads from them).
class Handle {
 public:
  Handle(reshard::RefitHandle handle, std::vector<nb::object> keep_alive)
      : handle_(std::move(handle)), keep_alive_(std::move(keep_alive)) {}
  // The handle goes before the buffers it registered (members would go in the other order), and
  // without the GIL, as in Close(): a handle collected without close() tears down the same way.
  ~Handle() {
    nb::gil_scoped_release release;
    handle_.reset();
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;

  reshard::RefitHandle& get() {
    if (!handle_) {
      throw StatusError{absl::FailedPreconditionError("the refit handle was closed")};
    }
    return *handle_;
  }
  // Destroys the handle (abandoning a refit in flight) and lets go of the buffers.
  void Close() {
    {
      nb::gil_scoped_release release;
      handle_.reset();
    }
    keep_alive_.clear();
  }
  bool closed() const { return !handle_; }

 private:
  std::optional<reshard::RefitHandle> handle_;
  std::vector<nb::object> keep_alive_;
};

// A blocking call of the handle (Execute, Wait, Barrier) with a deadline `timeout` seconds from
// now, without the GIL while it blocks.
template <absl::Status (reshard::RefitHandle::*Call)(absl::Time)>
void Blocking(Handle& h, double timeout) {
  const absl::Time deadline = DeadlineIn(timeout, "timeout");
  reshard::RefitHandle& handle = h.get();
  absl::Status status;
  {
    nb::gil_scoped_release release;
    status = (handle.*Call)(deadline);
  }
  Check(status);
}

// (side, name, address, bytes, memory kind, owner) as reshard/_buffers.py prepares them.
using BufferArg = std::tuple<reshard::Side, std::string, uintptr_t, int64_t, reshard::MemoryKind,
                             nb::object>;

std::unique_ptr<Handle> CreateHandle(const reshard::Communicator& comm,
                                     const reshard::RefitSpec& spec,
                                     const std::vector<BufferArg>& buffers,
                                     const reshard::HandleOptions& options) {
  reshard::LocalBuffers local;
  std::vector<nb::object> keep;
  for (const BufferArg& b : buffers) {
    local.Add(std::get<0>(b), std::get<1>(b),
              reshard::Buffer{reinterpret_cast<void*>(std::get<2>(b)), std::get<3>(b),
                              std::get<4>(b)});
    keep.push_back(std::get<5>(b));
  }
  absl::StatusOr<reshard::RefitHandle> handle;
  {
    nb::gil_scoped_release release;
    handle = reshard::RefitHandle::Create(comm, spec, std::move(local), options);
  }
  return std::make_unique<Handle>(Value(std::move(handle)), std::move(keep));
}

// DLPack's view of an array (numpy, torch, cupy, jax ...): what reshard/_buffers.py checks
// before it hands the address to a handle.
nb::dict ArrayInfo(nb::ndarray<> array) {
  nb::dict info;
  int64_t elements = 1;
  bool contiguous = true;
  int64_t expected = 1;
  for (size_t i = array.ndim(); i-- > 0;) {
    elements *= static_cast<int64_t>(array.shape(i));
    if (array.shape(i) != 1 && array.stride(i) != expected) contiguous = false;
    expected *= static_cast<int64_t>(array.shape(i));
  }
  const nb::dlpack::dtype dt = array.dtype();
  info["address"] = reinterpret_cast<uintptr_t>(array.data());
  info["itemsize"] = static_cast<int64_t>((dt.bits * dt.lanes + 7) / 8);
  info["elements"] = elements;
  info["dtype_code"] = static_cast<int>(dt.code);
  info["dtype_bits"] = static_cast<int>(dt.bits);
  info["device_type"] = static_cast<int>(array.device_type());
  info["device_id"] = static_cast<int>(array.device_id());
  info["contiguous"] = contiguous;
  return info;
}

}  // namespace

NB_MODULE(_reshard, m) {
  m.doc() = "reshard's C++ API (reshard/reshard.h); use the reshard package, not this module.";
  m.attr("__version__") = reshard::Version();

  // Exceptions: the classes live in reshard/errors.py (importable without this module).
  nb::module_ errors = nb::module_::import_("reshard.errors");
  nb::dict by_code = errors.attr("_BY_CODE");
  for (size_t code = 0; code < g_error_classes.size(); ++code) {
    nb::object cls = by_code.contains(nb::int_(code)) ? nb::object(by_code[nb::int_(code)])
                                                      : nb::object(errors.attr("Error"));
    g_error_classes[code] = cls.release().ptr();  // Lives as long as the interpreter.
  }
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const StatusError& e) {
      const size_t code = static_cast<size_t>(e.status.code());
      PyObject* cls = code < g_error_classes.size() ? g_error_classes[code] : g_error_classes[2];
      PyErr_SetString(cls, std::string(e.status.message()).c_str());
    }
  });

  nb::enum_<reshard::DType>(m, "DType")
      .value("bool", reshard::DType::kBool)
      .value("u8", reshard::DType::kU8)
      .value("i8", reshard::DType::kI8)
      .value("i16", reshard::DType::kI16)
      .value("i32", reshard::DType::kI32)
      .value("i64", reshard::DType::kI64)
      .value("fp8e4m3", reshard::DType::kFp8E4M3)
      .value("fp8e5m2", reshard::DType::kFp8E5M2)
      .value("fp16", reshard::DType::kFp16)
      .value("bf16", reshard::DType::kBf16)
      .value("fp32", reshard::DType::kFp32)
      .value("fp64", reshard::DType::kFp64)
      .def_prop_ro("itemsize", [](reshard::DType d) { return reshard::DTypeSize(d); })
      .def_prop_ro("spec_name", [](reshard::DType d) { return reshard::DTypeName(d); });

  nb::enum_<reshard::Side>(m, "Side")
      .value("source", reshard::Side::kSource)
      .value("destination", reshard::Side::kDestination);
  nb::enum_<reshard::MemoryKind>(m, "MemoryKind")
      .value("host", reshard::MemoryKind::kHost)
      .value("cuda", reshard::MemoryKind::kCuda);
  nb::enum_<reshard::QuantScheme>(m, "QuantScheme")
      .value("none", reshard::QuantScheme::kNone)
      .value("block", reshard::QuantScheme::kBlock)
      .value("mx", reshard::QuantScheme::kMx)
      .value("channel", reshard::QuantScheme::kChannel)
      .value("tensor", reshard::QuantScheme::kTensor);
  nb::enum_<reshard::Schedule>(m, "Schedule")
      .value("domain_aware", reshard::Schedule::kDomainAware)
      .value("point_to_point", reshard::Schedule::kPointToPoint);
  nb::enum_<reshard::Fanout>(m, "Fanout")
      .value("auto", reshard::Fanout::kAuto)
      .value("engine", reshard::Fanout::kEngine);

  nb::class_<reshard::Placement>(m, "Placement")
      .def_ro("shard", &reshard::Placement::shard)
      .def_ro("dim", &reshard::Placement::dim)
      .def_ro("split_factor", &reshard::Placement::split_factor)
      .def("__eq__", [](const reshard::Placement& a, const reshard::Placement& b) { return a == b; })
      .def("__hash__", [](const reshard::Placement& p) {
        return nb::hash(nb::make_tuple(p.shard, p.dim, p.split_factor));
      })
      .def("__repr__", [](const reshard::Placement& p) {
        if (!p.shard) return std::string("Replicate()");
        if (p.split_factor == 1) return "Shard(" + std::to_string(p.dim) + ")";
        return "StridedShard(" + std::to_string(p.dim) + ", " + std::to_string(p.split_factor) +
               ")";
      });
  m.def("Shard", &reshard::Shard, "dim"_a, "Shards tensor dim `dim` over a mesh axis.");
  m.def("StridedShard", &reshard::StridedShard, "dim"_a, "split_factor"_a,
        "torch's _StridedShard(dim, split_factor): FSDP2 over TP on a (dp, tp) mesh is "
        "[StridedShard(0, tp), Shard(0)] (docs/spec-format.md).");
  m.def("Replicate", &reshard::Replicate, "Replicates the tensor over a mesh axis.");

  nb::class_<reshard::Mesh>(m, "Mesh")
      .def(nb::init<std::vector<int32_t>>(), "ranks"_a, "A 1-D mesh over `ranks`.")
      .def(nb::init<std::vector<int64_t>, std::vector<int32_t>>(), "shape"_a, "ranks"_a,
           "An N-D mesh of `shape` over `ranks` in row-major order.")
      .def_static("range", &reshard::Mesh::Range, "first"_a, "count"_a)
      .def("reshape", &reshard::Mesh::Reshape, "shape"_a)
      .def_prop_ro("shape", &reshard::Mesh::shape)
      .def_prop_ro("ranks", &reshard::Mesh::ranks)
      .def_prop_ro("ndim", &reshard::Mesh::ndim)
      .def("__eq__", [](const reshard::Mesh& a, const reshard::Mesh& b) {
        return a.shape() == b.shape() && a.ranks() == b.ranks();
      })
      .def("__repr__", [](const reshard::Mesh& mesh) {
        return nb::str("Mesh(shape={}, ranks={})")
            .format(nb::cast(mesh.shape()), nb::cast(mesh.ranks()));
      });

  nb::class_<reshard::Layout>(m, "Layout")
      .def(nb::init<reshard::Mesh, std::vector<reshard::Placement>>(), "mesh"_a, "placements"_a)
      .def("in_buffer", &reshard::Layout::InBuffer, "buffer"_a, "offset"_a = 0,
           "strides"_a = std::vector<int64_t>{}, nb::rv_policy::reference_internal,
           "Places this side's tiles in the per-rank buffer `buffer` at element `offset` with "
           "element `strides` (empty: contiguous). Returns self.")
      .def("quantized", &reshard::Layout::Quantized, "fp8"_a, "scheme"_a,
           "block"_a = std::vector<int64_t>{}, nb::rv_policy::reference_internal,
           "Store this side's tiles as `fp8` quantized by `scheme` (a source: FP8 weights with "
           "block scales, into a quantized destination). Returns self.")
      .def("scales_in_buffer", &reshard::Layout::ScalesInBuffer, "buffer"_a, "offset"_a = 0,
           "strides"_a = std::vector<int64_t>{}, nb::rv_policy::reference_internal)
      .def_rw("mesh", &reshard::Layout::mesh)
      .def_rw("placements", &reshard::Layout::placements)
      .def_rw("buffer", &reshard::Layout::buffer)
      .def_ro("view_offset", &reshard::Layout::view_offset)
      .def_ro("view_strides", &reshard::Layout::view_strides)
      .def_ro("has_view", &reshard::Layout::has_view)
      .def_ro("dtype", &reshard::Layout::dtype)
      .def_ro("quant_scheme", &reshard::Layout::quant_scheme)
      .def_ro("quant_block", &reshard::Layout::quant_block)
      .def("__repr__", [](const reshard::Layout& l) {
        return nb::str("Layout({}, {})").format(nb::cast(l.mesh), nb::cast(l.placements));
      });

  nb::class_<reshard::TensorDesc>(m, "TensorDesc")
      .def_ro("name", &reshard::TensorDesc::name)
      .def_ro("dtype", &reshard::TensorDesc::dtype)
      .def_ro("shape", &reshard::TensorDesc::shape)
      .def_ro("src", &reshard::TensorDesc::src)
      .def_ro("dst", &reshard::TensorDesc::dst);

  nb::class_<reshard::BufferRequirement>(m, "BufferRequirement")
      .def_ro("name", &reshard::BufferRequirement::name)
      .def_ro("side", &reshard::BufferRequirement::side)
      .def_ro("bytes", &reshard::BufferRequirement::bytes)
      .def_ro("tensors", &reshard::BufferRequirement::tensors)
      .def("__repr__", [](const reshard::BufferRequirement& b) {
        return nb::str("BufferRequirement(name={!r}, side={}, bytes={})")
            .format(b.name, reshard::SideName(b.side), b.bytes);
      });

  nb::class_<reshard::LocalTile>(m, "LocalTile")
      .def_ro("tensor", &reshard::LocalTile::tensor)
      .def_ro("buffer", &reshard::LocalTile::buffer)
      .def_ro("side", &reshard::LocalTile::side)
      .def_ro("dtype", &reshard::LocalTile::dtype)
      .def_ro("global_shape", &reshard::LocalTile::global_shape)
      .def_ro("lo", &reshard::LocalTile::lo)
      .def_ro("hi", &reshard::LocalTile::hi)
      .def_ro("offset", &reshard::LocalTile::offset)
      .def_ro("strides", &reshard::LocalTile::strides)
      .def_ro("scales_of", &reshard::LocalTile::scales_of)
      .def_prop_ro("shape",
                   [](const reshard::LocalTile& t) {
                     std::vector<int64_t> shape(t.lo.size());
                     for (size_t d = 0; d < shape.size(); ++d) shape[d] = t.hi[d] - t.lo[d];
                     return shape;
                   })
      .def_prop_ro("num_elements", &reshard::LocalTile::num_elements)
      .def("__repr__", [](const reshard::LocalTile& t) {
        return nb::str("LocalTile(tensor={!r}, buffer={!r}, lo={}, hi={}, offset={})")
            .format(t.tensor, t.buffer, nb::cast(t.lo), nb::cast(t.hi), t.offset);
      });

  m.def("quant_block_shape", &reshard::QuantBlockShape, "shape"_a, "scheme"_a,
        "block"_a = std::vector<int64_t>{});

  nb::class_<reshard::RefitSpec>(m, "RefitSpec")
      .def(nb::init<>())
      .def_static("from_json", [](const std::string& text) {
        return Value(reshard::RefitSpec::FromJson(text));
      }, "text"_a)
      .def_static("from_file", [](const std::string& path) {
        return Value(reshard::RefitSpec::FromFile(path));
      }, "path"_a)
      .def("to_json", &reshard::RefitSpec::ToJson)
      .def("add_tensor", &reshard::RefitSpec::AddTensor, "name"_a, "dtype"_a, "shape"_a,
           "src"_a, "dst"_a, nb::rv_policy::reference_internal)
      .def("set_domains", &reshard::RefitSpec::SetDomains, "domains"_a,
           nb::rv_policy::reference_internal)
      .def("set_ranks_per_domain", &reshard::RefitSpec::SetRanksPerDomain, "n"_a,
           nb::rv_policy::reference_internal)
      .def("set_comment", &reshard::RefitSpec::SetComment, "comment"_a,
           nb::rv_policy::reference_internal)
      .def_prop_ro("tensors", &reshard::RefitSpec::tensors)
      .def_prop_ro("domains", &reshard::RefitSpec::domains)
      .def_prop_ro("ranks_per_domain", &reshard::RefitSpec::ranks_per_domain)
      .def_prop_ro("comment", &reshard::RefitSpec::comment)
      .def("validate", [](const reshard::RefitSpec& s) { Check(s.Validate()); })
      .def_prop_ro("world_size", &reshard::RefitSpec::WorldSize)
      .def("local_buffers", [](const reshard::RefitSpec& s, int32_t rank) {
        return Value(s.LocalBuffers(rank));
      }, "rank"_a)
      .def("local_tiles", [](const reshard::RefitSpec& s, int32_t rank, reshard::Side side) {
        return Value(s.LocalTiles(rank, side));
      }, "rank"_a, "side"_a);

  nb::class_<reshard::Communicator>(m, "Communicator")
      .def_static(
          "connect",
          [](const std::string& address, const std::string& token, int rank, int world_size,
             bool serve_store, double timeout) {
            reshard::Communicator::Options options;
            options.serve_store = serve_store;
            options.timeout = Seconds(timeout, "timeout");
            nb::gil_scoped_release release;
            return Value(
                reshard::Communicator::Connect(address, token, rank, world_size, options));
          },
          "address"_a, "token"_a, "rank"_a, "world_size"_a, "serve_store"_a = false,
          "timeout"_a = 30.0)
      .def_static("from_env", [] {
        nb::gil_scoped_release release;
        return Value(reshard::Communicator::FromEnvironment());
      })
      .def_static(
          "_from_callbacks",
          [](nb::object set, nb::object get, nb::object list, nb::object del, int rank,
             int world_size) {
            reshard::StoreCallbacks cb = MakeStoreCallbacks(std::move(set), std::move(get),
                                                            std::move(list), std::move(del));
            nb::gil_scoped_release release;
            return Value(reshard::Communicator::FromCallbacks(std::move(cb), rank, world_size));
          },
          "set"_a, "get"_a, "list"_a.none(), "delete"_a.none(), "rank"_a, "world_size"_a)
      .def_prop_ro("rank", &reshard::Communicator::rank)
      .def_prop_ro("world_size", &reshard::Communicator::world_size)
      .def_prop_ro("local_rank", &reshard::Communicator::local_rank,
                   "The rank on this host the launcher gave (LOCAL_RANK ...), or -1.")
      .def_prop_ro("store_description", &reshard::Communicator::store_description)
      .def("__repr__", [](const reshard::Communicator& c) {
        return nb::str("Communicator(rank={}, world_size={}, store={!r})")
            .format(c.rank(), c.world_size(), c.store_description());
      });

  nb::class_<reshard::Stats>(m, "Stats")
      .def_ro("epoch", &reshard::Stats::epoch)
      .def_ro("bytes_network_sent", &reshard::Stats::bytes_network_sent)
      .def_ro("bytes_network_received", &reshard::Stats::bytes_network_received)
      .def_ro("bytes_local", &reshard::Stats::bytes_local)
      .def_ro("planned_network_in", &reshard::Stats::planned_network_in)
      .def_ro("planned_network_out", &reshard::Stats::planned_network_out)
      .def_ro("planned_fanout_in", &reshard::Stats::planned_fanout_in)
      .def_ro("planned_fanout_out", &reshard::Stats::planned_fanout_out)
      .def_ro("planned_local", &reshard::Stats::planned_local)
      .def_ro("pieces_received", &reshard::Stats::pieces_received)
      .def_ro("pieces_expected", &reshard::Stats::pieces_expected)
      .def_ro("puts", &reshard::Stats::puts)
      .def_ro("data_messages", &reshard::Stats::data_messages)
      .def_ro("single_copy_writes", &reshard::Stats::single_copy_writes)
      .def_ro("mapped_copies", &reshard::Stats::mapped_copies)
      .def_ro("signals", &reshard::Stats::signals)
      .def_ro("start_seconds", &reshard::Stats::start_seconds)
      .def_ro("wait_seconds", &reshard::Stats::wait_seconds)
      .def_ro("total_seconds", &reshard::Stats::total_seconds)
      .def_ro("transports", &reshard::Stats::transports)
      .def_ro("fanout", &reshard::Stats::fanout)
      .def_ro("bytes_fanout_sent", &reshard::Stats::bytes_fanout_sent)
      .def_ro("bytes_fanout_received", &reshard::Stats::bytes_fanout_received)
      .def_ro("fanout_busy_seconds", &reshard::Stats::fanout_busy_seconds)
      .def_ro("fanout_hidden_fraction", &reshard::Stats::fanout_hidden_fraction)
      .def_ro("fanout_domain_hidden_fraction", &reshard::Stats::fanout_domain_hidden_fraction)
      .def_ro("registrations_total", &reshard::Stats::registrations_total)
      .def_ro("quantize_seconds", &reshard::Stats::quantize_seconds)
      .def_ro("amax_exchange_seconds", &reshard::Stats::amax_exchange_seconds)
      .def_ro("quantize_buffer_bytes", &reshard::Stats::quantize_buffer_bytes)
      .def_ro("registrations_this_refit", &reshard::Stats::registrations_this_refit)
      .def_ro("cuda_buffers_registered", &reshard::Stats::cuda_buffers_registered)
      .def_ro("cuda_buffers_staged", &reshard::Stats::cuda_buffers_staged)
      .def_ro("bytes_staged_to_host", &reshard::Stats::bytes_staged_to_host)
      .def_ro("bytes_staged_to_device", &reshard::Stats::bytes_staged_to_device)
      .def_ro("stage_ring_bytes", &reshard::Stats::stage_ring_bytes)
      .def_ro("stage_copy_bytes", &reshard::Stats::stage_copy_bytes)
      .def_ro("stage_landing_bytes", &reshard::Stats::stage_landing_bytes)
      .def_ro("stage_landing_rounds", &reshard::Stats::stage_landing_rounds)
      .def_ro("stage_ring_batches", &reshard::Stats::stage_ring_batches)
      .def_ro("bytes_ring_packed", &reshard::Stats::bytes_ring_packed)
      .def_ro("stage_round_scatters", &reshard::Stats::stage_round_scatters)
      .def_ro("local_copy_launches", &reshard::Stats::local_copy_launches)
      .def_ro("stage_bounce_bytes", &reshard::Stats::stage_bounce_bytes)
      .def_ro("bounced_data_messages", &reshard::Stats::bounced_data_messages)
      .def_ro("bounce_waits", &reshard::Stats::bounce_waits)
      .def_ro("landing_area_bytes", &reshard::Stats::landing_area_bytes)
      .def_ro("send_scratch_bytes", &reshard::Stats::send_scratch_bytes)
      .def_ro("delta_relay_early_segments", &reshard::Stats::delta_relay_early_segments)
      .def_ro("relay_early_bytes", &reshard::Stats::relay_early_bytes)
      .def_ro("delta_pieces", &reshard::Stats::delta_pieces)
      .def_ro("delta_full_no_base", &reshard::Stats::delta_full_no_base)
      .def_ro("delta_full_receiver_version", &reshard::Stats::delta_full_receiver_version)
      .def_ro("delta_full_not_smaller", &reshard::Stats::delta_full_not_smaller)
      .def_ro("delta_stream_bytes", &reshard::Stats::delta_stream_bytes)
      .def_ro("delta_plain_bytes", &reshard::Stats::delta_plain_bytes)
      .def_ro("delta_shadow_bytes", &reshard::Stats::delta_shadow_bytes)
      .def_ro("delta_device_shadow_bytes", &reshard::Stats::delta_device_shadow_bytes)
      .def_ro("delta_pinned_bytes", &reshard::Stats::delta_pinned_bytes)
      .def_ro("deltas_applied", &reshard::Stats::deltas_applied);

  nb::class_<reshard::HostBuffer>(m, "HostBuffer",
      "Host memory every process of this host can map (shared memory): a destination buffer "
      "here is written by same-host senders and domain peers with one memcpy through a mapping, "
      "where ordinary memory takes process_vm_writev at about half the speed.")
      .def_static("allocate", [](int64_t bytes, const std::string& tag) {
        return Value(reshard::HostBuffer::Allocate(bytes, tag));
      }, "nbytes"_a, "tag"_a = "buf",
         "Zero-filled, page-aligned; `tag` (letters, digits, '-', '_', '.') names it in /dev/shm.")
      .def_prop_ro("address", [](const reshard::HostBuffer& b) {
        return reinterpret_cast<uintptr_t>(b.data());
      })
      .def_prop_ro("nbytes", &reshard::HostBuffer::bytes)
      .def("numpy", [](nb::handle self) {
        const reshard::HostBuffer& b = nb::cast<const reshard::HostBuffer&>(self);
        const size_t shape[1] = {static_cast<size_t>(b.bytes())};
        // The array keeps this HostBuffer (its owner) alive.
        return nb::ndarray<nb::numpy, uint8_t, nb::ndim<1>>(static_cast<uint8_t*>(b.data()), 1,
                                                             shape, self);
      }, "The bytes as a writable uint8 numpy array (view it as any dtype: .view(np.float32); "
         "torch.from_numpy(...).view(torch.bfloat16) for torch).");

  nb::class_<reshard::HandleOptions>(m, "HandleOptions")
      .def(nb::init<>())
      .def_rw("name", &reshard::HandleOptions::name)
      .def_rw("schedule", &reshard::HandleOptions::schedule)
      .def_rw("fanout", &reshard::HandleOptions::fanout)
      .def_prop_rw(
          "setup_timeout",
          [](const reshard::HandleOptions& o) { return absl::ToDoubleSeconds(o.setup_timeout); },
          [](reshard::HandleOptions& o, double s) {
            o.setup_timeout = Seconds(s, "setup_timeout");
          })
      .def_rw("allow_larger_buffers", &reshard::HandleOptions::allow_larger_buffers)
      .def_rw("delta", &reshard::HandleOptions::delta)
      .def_rw("stage_ring_bytes", &reshard::HandleOptions::stage_ring_bytes)
      .def_rw("stage_landing_bytes", &reshard::HandleOptions::stage_landing_bytes)
      .def_rw("stage_round_bytes", &reshard::HandleOptions::stage_round_bytes);

  nb::class_<Handle>(m, "_Handle")
      .def_static("create", &CreateHandle, "comm"_a, "spec"_a, "buffers"_a, "options"_a)
      // RefitHandle::Abandon: `code` an absl::StatusCode value (reshard.errors' _BY_CODE keys).
      .def_static(
          "abandon",
          [](const reshard::Communicator& comm, const reshard::RefitSpec& spec, int code,
             const std::string& message, const reshard::HandleOptions& options) {
            const absl::StatusCode c = code > 0 && code <= 16 ? static_cast<absl::StatusCode>(code)
                                                              : absl::StatusCode::kUnknown;
            nb::gil_scoped_release release;
            (void)reshard::RefitHandle::Abandon(comm, spec, absl::Status(c, message), options);
          },
          "comm"_a, "spec"_a, "code"_a, "message"_a, "options"_a)
      .def("execute", Blocking<&reshard::RefitHandle::Execute>, "timeout"_a)
      .def("start", [](Handle& h) { Check(h.get().Start()); })
      // Streams as integers (a cudaStream_t's value: torch.cuda.Stream.cuda_stream).
      .def("start_on_stream",
           [](Handle& h, uintptr_t stream) {
             Check(h.get().StartOnStream(reinterpret_cast<void*>(stream)));
           },
           "stream"_a)
      .def("record_completion",
           [](Handle& h, uintptr_t stream) {
             Check(h.get().RecordCompletion(reinterpret_cast<void*>(stream)));
           },
           "stream"_a)
      .def("wait", Blocking<&reshard::RefitHandle::Wait>, "timeout"_a)
      .def("barrier", Blocking<&reshard::RefitHandle::Barrier>, "timeout"_a)
      .def("reset", [](Handle& h) { h.get().Reset(); })
      .def("close", &Handle::Close)
      .def_prop_ro("closed", &Handle::closed)
      .def_prop_ro("failed", [](Handle& h) { return h.get().failed(); })
      .def_prop_ro("epoch", [](Handle& h) { return h.get().epoch(); })
      .def_prop_ro("rank", [](Handle& h) { return h.get().rank(); })
      .def_prop_ro("plan_fingerprint", [](Handle& h) { return h.get().plan_fingerprint(); })
      .def_prop_ro("stats", [](Handle& h) { return h.get().stats(); });

  m.def("_array_info", &ArrayInfo, "array"_a,
        "DLPack's view of an array: address, itemsize, elements, dtype code and bits, device "
        "type and id, C-contiguity.");
}
